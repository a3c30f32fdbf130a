"""The one DuckDB writer of a live process: a thread that owns the write connection and commits rows in groups."""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kvcost.data.store import LogStore, TableBatch

_log = logging.getLogger(__name__)


class LogUnavailableError(RuntimeError):
    """The log writer could not commit (503): the observation is not recorded, retry."""


@dataclass(slots=True)
class _Write:
    rows: TableBatch
    urgent: bool = False
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


_STOP = object()


class LogWriter:
    """The service's one DuckDB writer: a thread that owns the write connection and commits queued rows in groups.

    Each batch (everything queued when the thread wakes, up to
    ``max_batch_writes``) is one transaction: one ``INSERT`` per table, one
    commit, one WAL sync. A batch of only non-urgent writes waits up to
    ``linger_s`` for more (a commit costs ~2.5 ms of CPU whatever its size, so
    per-decision commits would cost more than routing); an urgent write (an
    observation someone waits for), a full batch or :meth:`stop` ends the wait,
    and everything queued by then is committed together. While it lingers the
    thread sleeps: a non-urgent write does not wake it (a wake-up per write
    costs the submitting thread a GIL hand-off, which the gateway would pay
    twice per request; docs/gateway.md). A write's future resolves to the rows
    written once the commit has returned, or raises the error that rolled the
    batch back.
    Every ``roll_interval_s`` (when given) and on stop, ``roll()`` runs on the
    same thread (it may read through the connection).

    ``on_write_error`` is called on the writer thread each time a batch is rolled back.

    Thread safety: :meth:`submit` from any thread; everything else runs on the writer thread.
    """

    def __init__(
        self,
        store: LogStore,
        on_write_error: Callable[[], object] = lambda: None,
        max_queued: int = 100_000,
        max_batch_writes: int = 4096,
        roll: Callable[[], object] | None = None,
        roll_interval_s: float = 0.0,
        linger_s: float = 0.0,
    ) -> None:
        self.store = store
        self.linger_s = linger_s
        self.on_write_error = on_write_error
        self.max_batch_writes = max_batch_writes
        self.roll = roll
        self.roll_interval_s = roll_interval_s
        self.last_error: str | None = None
        self.batches = 0
        self._queue: queue.Queue = queue.Queue(maxsize=max_queued)
        self._thread = threading.Thread(target=self._run, name="kvcost-log-writer", daemon=True)
        self._wake = threading.Event()  # ends a linger: an urgent write, a full batch, or stop
        self._last_roll = time.monotonic()

    @property
    def alive(self) -> bool:
        """The thread is running."""
        return self._thread.is_alive()

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def submit(self, rows: TableBatch, urgent: bool = False) -> concurrent.futures.Future:
        """Queue ``rows`` for :meth:`LogStore.append`; the future resolves to their count after the commit.

        Args:
            rows: the rows to append (e.g. :func:`kvcost.data.log_rows.request_batch`).
            urgent: someone waits for the commit: commit as soon as possible; otherwise the
                writer lingers up to ``linger_s`` to commit more rows in the same transaction.

        Raises:
            LogUnavailableError: the queue is full (the disk does not keep up) or the writer stopped.
        """
        if not self.alive:
            raise LogUnavailableError("the log writer is not running")
        write = _Write(rows, urgent)
        try:
            self._queue.put_nowait(write)
        except queue.Full:
            raise LogUnavailableError(f"{self._queue.maxsize} log writes queued; the log does not keep up") from None
        if urgent or self._queue.qsize() >= self.max_batch_writes:
            self._wake.set()
        return write.future

    def stop(self, timeout_s: float = 30.0) -> None:
        """Commit what is queued, roll a last time, and end the thread (idempotent)."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._wake.set()
            self._thread.join(timeout_s)

    def _run(self) -> None:
        stopping = False
        while not stopping:
            try:
                first = self._queue.get(timeout=self._wait_s())
            except queue.Empty:
                self._maybe_roll()
                continue
            batch: list[_Write] = []
            item = first
            while True:
                if item is _STOP:
                    stopping = True
                else:
                    batch.append(item)
                if len(batch) >= self.max_batch_writes:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if batch and not stopping and not any(w.urgent for w in batch):
                stopping = self._linger(batch)
            if batch:
                self._commit(batch)
            self._maybe_roll(force=stopping)

    def _linger(self, batch: list[_Write]) -> bool:
        """Sleep up to ``linger_s`` (woken early by an urgent write, a full batch or stop), then add what was
        queued meanwhile to ``batch`` (up to ``max_batch_writes``). Returns whether stop was asked."""
        self._wake.wait(self.linger_s)
        self._wake.clear()
        while len(batch) < self.max_batch_writes:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return False
            if item is _STOP:
                return True
            batch.append(item)
        return False

    def _wait_s(self) -> float | None:
        if self.roll is None or self.roll_interval_s <= 0:
            return None
        return max(0.0, self._last_roll + self.roll_interval_s - time.monotonic())

    def _maybe_roll(self, force: bool = False) -> None:
        if self.roll is None or (self.roll_interval_s <= 0 and not force):
            return
        if force or time.monotonic() - self._last_roll >= self.roll_interval_s:
            self._last_roll = time.monotonic()
            try:
                self.roll()
            except Exception:
                _log.exception("rolling the log into segments failed")

    def _commit(self, batch: list[_Write]) -> None:
        batch = [w for w in batch if w.future.set_running_or_notify_cancel()]
        by_table: dict[str, list[TableBatch]] = {}
        for write in batch:
            by_table.setdefault(write.rows.table, []).append(write.rows)
        try:
            with self.store.transaction():
                for groups in by_table.values():
                    self.store.append(TableBatch.concat(groups))
        except Exception as exc:
            self.last_error = f"{type(exc).__name__}: {exc}".splitlines()[0]
            self.on_write_error()
            _log.exception("log write of %d row groups failed", len(batch))
            for write in batch:
                write.future.set_exception(exc)
            return
        self.last_error = None
        self.batches += 1
        for write in batch:
            write.future.set_result(write.rows.num_rows)
