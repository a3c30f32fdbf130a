"""The requests a router has routed, for counts over a recent window.

``cost_aware``'s move price (:func:`kvcost.routing.policies.basic.move_price_s`)
asks, for a window ``[start_s, end_s)`` that ends at the decision: how many
requests arrived, how many seconds of prefill they brought, and how many of them
carried a given block hash (a prefix family). Only the router's own decisions are
logged, so a live gateway and a replay see the same thing; the workers' true queues
are never read.

Thread safety: not thread-safe; one owner (a policy instance).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Sequence

#: Seconds of arrivals kept (:class:`ArrivalLog`). A window longer than this counts only its last
#: ``DEFAULT_HORIZON_S``: the move price's windows are a candidate's predicted busy time (queue +
#: prefill), which passes 10 minutes only in an overload no router recovers from, where the count is
#: large either way. Ten minutes bounds the memory at ten minutes of arrivals × their full blocks.
DEFAULT_HORIZON_S = 600.0


class _Times:
    """Non-decreasing times in a list with a moving head: O(1) to append and to drop the oldest, O(log n) to
    count a window (a deque would index its middle in O(n))."""

    __slots__ = ("head", "times")

    def __init__(self) -> None:
        self.times: list[float] = []
        self.head = 0

    def __len__(self) -> int:
        return len(self.times) - self.head

    def bounds(self, start_s: float, end_s: float) -> tuple[int, int]:
        """List indices ``[first, last)`` of the times in ``[start_s, end_s)``."""
        first = bisect.bisect_left(self.times, start_s, self.head)
        return first, max(first, bisect.bisect_left(self.times, end_s, self.head))

    def drop_first(self) -> int:
        """Drop the oldest time; returns how many list slots were compacted away (0 or the old head)."""
        self.head += 1
        if self.head < 64 or self.head * 2 < len(self.times):
            return 0
        dropped, self.head = self.head, 0
        del self.times[:dropped]
        return dropped


class ArrivalLog:
    """Arrival times, cumulative prefill seconds and, per block hash, the arrivals that carried it.

    Entries must come in non-decreasing time order; those older than the newest minus
    ``horizon_s`` are dropped as new ones come. Each query is O(log n).

    Args:
        horizon_s: seconds of arrivals kept (> 0).

    Raises:
        ValueError: ``horizon_s`` not > 0.

    Example:
        >>> log = ArrivalLog()
        >>> log.add(0.0, 0.5, (11, 12))
        >>> log.add(1.0, 0.25, (11, 13))
        >>> log.window(0.0, 2.0), log.carrying(11, 0.5, 2.0)
        ((2, 0.75), 1)
    """

    def __init__(self, horizon_s: float = DEFAULT_HORIZON_S) -> None:
        if not horizon_s > 0:
            raise ValueError(f"horizon_s = {horizon_s}, expected a number > 0")
        self.horizon_s = horizon_s
        self._times = _Times()
        #: prefill seconds of the arrivals before each slot of ``_times.times``, and after the last
        self._cumulative_s: list[float] = [0.0]
        self._hashes: deque[Sequence[int]] = deque()
        self._by_hash: dict[int, _Times] = {}

    def __len__(self) -> int:
        return len(self._times)

    def add(self, time_s: float, prefill_s: float, block_hashes: Sequence[int]) -> None:
        """Log one routed request: its arrival ``time_s`` (s, ≥ the last one), the prefill seconds
        predicted where it went (finite, ≥ 0) and its prompt's full-block hashes.

        Raises:
            ValueError: ``time_s`` before the last arrival, or ``prefill_s`` negative or not finite.
        """
        if len(self._times) and time_s < self._times.times[-1]:
            raise ValueError(f"time_s = {time_s}, expected ≥ the last arrival's {self._times.times[-1]}")
        if not (math.isfinite(prefill_s) and prefill_s >= 0):
            raise ValueError(f"prefill_s = {prefill_s}, expected a finite number ≥ 0")
        self._expire(time_s - self.horizon_s)
        self._times.times.append(time_s)
        self._cumulative_s.append(self._cumulative_s[-1] + prefill_s)
        self._hashes.append(block_hashes)
        for block_hash in dict.fromkeys(block_hashes):
            self._by_hash.setdefault(block_hash, _Times()).times.append(time_s)

    def window(self, start_s: float, end_s: float) -> tuple[int, float]:
        """``(arrivals, prefill seconds)`` of the requests that arrived in ``[start_s, end_s)``."""
        first, last = self._times.bounds(start_s, end_s)
        if last == first:
            return 0, 0.0
        return last - first, self._cumulative_s[last] - self._cumulative_s[first]

    def carrying(self, block_hash: int, start_s: float, end_s: float) -> int:
        """How many of the requests that arrived in ``[start_s, end_s)`` had ``block_hash`` in their prompt."""
        times = self._by_hash.get(block_hash)
        if times is None:
            return 0
        first, last = times.bounds(start_s, end_s)
        return last - first

    def _expire(self, before_s: float) -> None:
        while len(self._times) and self._times.times[self._times.head] < before_s:
            compacted = self._times.drop_first()
            if compacted:
                del self._cumulative_s[:compacted]
            for block_hash in dict.fromkeys(self._hashes.popleft()):
                times = self._by_hash[block_hash]
                times.drop_first()
                if not len(times):
                    del self._by_hash[block_hash]
