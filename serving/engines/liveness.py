"""Which engines answer, and which came back as a new process: no false hit on a dead or restarted engine.

A vLLM engine's prefix cache lives in its process. When the process dies, its
cache is gone; when a new one starts, it is empty, and the directory learns so
only from the new engine's first KV event batch (a sequence number that goes
back), which comes only once that engine has stored something. Until then the
directory would keep promising the old blocks.

:class:`EngineLiveness` closes that window from two signals:

* **reachability** — every metrics scrape (and every request the gateway fails
  to deliver) says whether the engine answers. One that does not is marked
  unknown in the directory (:meth:`CacheDirectory.mark_unknown`: it matches
  nothing, and every score says ``directory_stale``);
* **identity** — each scrape reads ``process_start_time_seconds`` (the Prometheus
  client's process collector, exposed by vLLM and SGLang on Linux). A value that
  changes means a new process: the worker's entries are dropped and its KV event
  sequence is forgotten (the new engine counts from 0) *before* it is matched
  again. The same value means the same process (a scrape timed out under load):
  its entries count again.

An engine that exposes no start time is taken to be the same process when it
answers again; its KV events' sequence then detects a restart, as before.

Thread safety: called on the service's event loop; the directory and the
ingestor are touched under the service's ``lock`` (the KV event thread's lock).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from kvcost.routing.directory import CacheDirectory
from kvcost.serving.engines.engine_metrics import EngineMetrics
from kvcost.serving.engines.kv_events import KVEventIngestor

logger = logging.getLogger(__name__)


class EngineLiveness:
    """Marks workers unknown while their engine does not answer; drops the entries of a restarted one.

    Args:
        directory: the service's cache directory.
        lock: guards ``directory`` and ``ingestor`` (the service's lock).
        clock: wall clock, epoch seconds (stamps a clear).
        ingestor: the KV event ingestor feeding ``directory``, or None (approximate mode only).
        on_new_process: called with the worker id when its engine answers as a new process (the
            gateway ends that engine's failure backoff: the failures were the old process's).
    """

    def __init__(
        self,
        directory: CacheDirectory,
        lock: threading.Lock,
        clock: Callable[[], float],
        ingestor: KVEventIngestor | None = None,
        on_new_process: Callable[[int], object] | None = None,
    ) -> None:
        self.directory = directory
        self.on_new_process = on_new_process
        self.lock = lock
        self.clock = clock
        self.ingestor = ingestor
        #: Process start time last read per worker (epoch seconds).
        self.started_s: dict[int, float] = {}
        #: Restarts detected from a new process start time, per worker.
        self.restarts: dict[int, int] = {}

    def on_scrape(self, worker_id: int, metrics: EngineMetrics | None) -> None:
        """A scrape's outcome: None = the engine did not answer (unknown), else what it exposed."""
        if metrics is None:
            self.unreachable(worker_id)
            return
        started_s = metrics.process_start_time_s
        previous_s = self.started_s.get(worker_id)
        restarted = started_s is not None and previous_s is not None and started_s != previous_s
        with self.lock:
            if restarted:
                logger.warning(
                    "worker %d: a new engine process (started at %.3f, was %.3f): its directory entries are dropped",
                    worker_id, started_s, previous_s,
                )  # fmt: skip
                self.restarts[worker_id] = self.restarts.get(worker_id, 0) + 1
                self.directory.clear_worker(worker_id, self.clock())
                if self.ingestor is not None:
                    self.ingestor.forget_worker(worker_id)
            self.directory.mark_known(worker_id)
        if started_s is not None:
            self.started_s[worker_id] = started_s
        if restarted and self.on_new_process is not None:
            self.on_new_process(worker_id)

    def unreachable(self, worker_id: int) -> None:
        """The engine did not answer (a scrape, or a request the gateway could not deliver): mark it unknown."""
        with self.lock:
            if not self.directory.is_unknown(worker_id):
                logger.warning("worker %d: engine unreachable; its directory entries are unknown until it answers",
                               worker_id)  # fmt: skip
            self.directory.mark_unknown(worker_id)
