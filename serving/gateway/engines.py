"""The engines behind the gateway: base URLs, and which may be sent a request now (failure backoff).

An engine that refuses a connection, times out or answers 5xx before the first
byte is skipped for ``backoff_s``, doubling with each failure in a row up to
``backoff_max_s`` (the usual capped exponential backoff of load balancers, e.g.
Envoy's outlier ejection, whose base ejection time is 30 s); the first request
after the backoff is a probe: success clears the record, failure doubles the
backoff. A metrics scrape that reaches the engine clears it too. When every
engine is backing off, all are candidates again (a request is never refused
for want of a healthy engine while one might answer).

Thread safety: the event loop only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Failures:
    in_row: int = 0
    until_s: float = 0.0
    last_reason: str = ""


class EnginePool:
    """Base URL per worker, and each worker's failure backoff.

    Args:
        urls: worker id → base URL (``http://HOST:PORT``, no trailing slash).
        clock: monotonic seconds.
        backoff_s: first backoff after a failure, seconds (> 0).
        backoff_max_s: longest backoff, seconds (≥ ``backoff_s``).

    Raises:
        ValueError: no engine, or backoffs out of range.
    """

    def __init__(
        self, urls: dict[int, str], clock: Callable[[], float], backoff_s: float = 1.0, backoff_max_s: float = 30.0
    ) -> None:
        if not urls:
            raise ValueError("urls is empty, expected at least one engine")
        if not 0 < backoff_s <= backoff_max_s:
            raise ValueError(f"backoff_s = {backoff_s}, backoff_max_s = {backoff_max_s}, expected 0 < first ≤ max")
        self.urls = dict(sorted(urls.items()))
        self.clock = clock
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self._failures: dict[int, _Failures] = {}

    @property
    def worker_ids(self) -> list[int]:
        """Every worker, ascending."""
        return list(self.urls)

    def available(self, exclude: Iterable[int] = ()) -> list[int]:
        """Workers not backing off (ascending), less ``exclude``; every worker but ``exclude`` if all are."""
        skip = set(exclude)
        now_s = self.clock()
        candidates = [w for w in self.urls if w not in skip]
        healthy = [w for w in candidates if self._failures.get(w, _Failures()).until_s <= now_s]
        return healthy or candidates

    def failed(self, worker_id: int, reason: str) -> float:
        """Record a failure of ``worker_id``; returns the backoff it now serves, seconds."""
        record = self._failures.setdefault(worker_id, _Failures())
        record.in_row += 1
        backoff_s = min(self.backoff_max_s, self.backoff_s * 2 ** (record.in_row - 1))
        record.until_s = self.clock() + backoff_s
        record.last_reason = reason
        logger.warning("engine %d (%s) failed (%s): skipped for %.1f s", worker_id, self.urls[worker_id], reason,
                       backoff_s)  # fmt: skip
        return backoff_s

    def succeeded(self, worker_id: int) -> None:
        """``worker_id`` answered: its failure record is cleared."""
        self._failures.pop(worker_id, None)

    def backing_off(self) -> dict[int, str]:
        """Workers backing off now, with the reason of their last failure."""
        now_s = self.clock()
        return {w: f.last_reason for w, f in self._failures.items() if f.until_s > now_s}
