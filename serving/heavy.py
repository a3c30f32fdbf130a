"""CPU-bound request work off the event loop: a bounded pool of worker processes.

Two kinds of work go there: ``POST /v1/evict/rank`` (parsed, validated, ranked and
serialised in the worker), and the parsing, validation and token hashing of a
``/v1/score`` or ``/v1/route`` body larger than ``heavy_body_bytes`` (a
1,048,576-token prompt is 8 MiB of JSON: about 0.2 s to validate and 0.36 s to
hash on this machine), whose validated body comes back with block hashes in place
of its token ids; the scoring itself stays in the service, which owns the directory.

A rank of 100,000 prefix nodes costs about 1–2 s of CPU, body parsing included
(about 0.5 s of JSON and validation, 0.3 s to build the node table, 0.4 s to
rank). On the event loop it would stall every other endpoint (``/healthz``,
``/v1/route``) for that long, and Python threads do not help: the GIL serialises
the work. The body is therefore read as bytes on the loop (cheap) and parsed,
validated, ranked and serialised in a worker process; the loop only sends
bytes back.

Bounded: at most ``workers`` requests run and ``queue_limit`` more wait; a
request beyond that is refused with :class:`PoolBusyError` (the API answers 503
with ``Retry-After``), so a burst of heavy requests cannot queue unbounded work
or memory. Worker processes are started with ``spawn`` (the service has
threads: the log writer, the KV-event subscriber; ``fork`` would copy their
locks), when ``kvcost serve`` starts (:meth:`HeavyPool.warm`; an app built in
a test starts them at its first heavy request), and each loads the P(reuse)
model of ``--reuse-model-dir`` once. A worker ends by itself when the service
process is gone, ``kill -9`` included.

Thread safety: :meth:`HeavyPool.rank` and :meth:`HeavyPool.parse_score` from the event loop only.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import multiprocessing
import os
import threading
import time
from concurrent.futures.process import BrokenProcessPool

from kvcost.models.reuse import load_reuse_model
from kvcost.serving.error_bodies import field_error_body, parse_json_body
from kvcost.serving.errors import FieldError
from kvcost.serving.eviction_wire import rank_request
from kvcost.serving.routing import with_block_hashes
from kvcost.serving.schemas import EvictRankIn, ScoreRequestIn
from kvcost.serving.settings import ServiceSettings


class PoolBusyError(RuntimeError):
    """Every worker is busy and the queue is full: retry after ``retry_after_s`` seconds (the API's 503)."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class HeavyPool:
    """A bounded process pool for CPU-bound request handling.

    Args:
        settings: the service's settings: ``heavy_workers`` worker processes (each runs one request at a
            time), ``heavy_queue_limit`` requests that may wait for one before new ones are refused, the
            P(reuse) model of ``reuse_model_dir`` for ``cost_aware`` ranking, and how tokens are hashed.
        retry_after_s: the ``Retry-After`` a refused request is given, seconds (≥ 1).

    Raises:
        ValueError: an argument out of range (names it).
    """

    def __init__(self, settings: ServiceSettings, retry_after_s: int = 1) -> None:
        if retry_after_s < 1:
            raise ValueError(f"retry_after_s = {retry_after_s}, expected ≥ 1")
        self.workers = settings.heavy_workers
        self.queue_limit = settings.heavy_queue_limit
        self.retry_after_s = retry_after_s
        self._settings = settings
        self._executor: concurrent.futures.ProcessPoolExecutor | None = None
        self.in_flight = 0
        #: Requests refused because the pool was full.
        self.refused = 0

    async def rank(self, raw: bytes) -> tuple[int, bytes]:
        """Parse, validate and rank one ``/v1/evict/rank`` body in a worker: ``(HTTP status, JSON body)``.

        Raises:
            PoolBusyError: ``workers + queue_limit`` requests are already admitted.
        """
        return await self._run(rank_body, raw)

    async def parse_score(self, raw: bytes) -> ScoreRequestIn | bytes:
        """Parse and validate a large ``/v1/score`` / ``/v1/route`` body in a worker, its token ids hashed
        (:func:`parse_score_body` with ``hash_tokens``): the body, or the 422 error body.

        Raises:
            PoolBusyError: as :meth:`rank`.
        """
        return await self._run(parse_score_body, raw, True)

    async def _run(self, fn, *args):
        if self.in_flight >= self.workers + self.queue_limit:
            self.refused += 1
            raise PoolBusyError(
                f"{self.in_flight} heavy requests are running or queued (limit {self.workers} running "
                f"+ {self.queue_limit} queued); retry after {self.retry_after_s} s",
                self.retry_after_s,
            )
        self.in_flight += 1
        try:
            return await asyncio.wrap_future(self._pool().submit(fn, *args))
        except BrokenProcessPool:  # a worker died (killed, out of memory)
            self.shutdown()  # the next request starts a new pool
            raise PoolBusyError(
                f"a heavy-request worker process died; retry after {self.retry_after_s} s", self.retry_after_s
            ) from None
        finally:
            self.in_flight -= 1

    def _pool(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._executor is None:
            self._executor = concurrent.futures.ProcessPoolExecutor(
                self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_worker,
                initargs=(self._settings, os.getpid()),
            )
        return self._executor

    def warm(self) -> None:
        """Start every worker process now (each imports the service's modules, about 1–5 s of CPU), so that
        the first heavy request does not wait for it. Returns at once."""
        pool = self._pool()
        for _ in range(self.workers):
            pool.submit(_ready)

    def shutdown(self) -> None:
        """Stop the workers (running requests finish; queued ones are cancelled). Idempotent."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)


#: The worker process's settings and P(reuse) model (set by its initializer).
_SETTINGS: ServiceSettings | None = None
_REUSE_MODEL = None


def _start_worker(settings: ServiceSettings, parent_pid: int) -> None:
    global _SETTINGS, _REUSE_MODEL
    _SETTINGS = settings
    if settings.reuse_model_dir is not None:
        _REUSE_MODEL = load_reuse_model(settings.reuse_model_dir)
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True, name="parent-watch").start()


def _exit_with_parent(parent_pid: int, interval_s: float = 0.5) -> None:
    """End this worker once the service process is gone (``kill -9`` gives it no chance to stop its pool):
    the worker is then re-parented, so its parent id changes."""
    while os.getppid() == parent_pid:
        time.sleep(interval_s)
    os._exit(0)


def _ready() -> bool:
    return True


def parse_score_body(raw: bytes, hash_tokens: bool = False, settings: ServiceSettings | None = None):
    """A ``/v1/score`` / ``/v1/route`` body → the validated :class:`ScoreRequestIn`, or the 422 error body (bytes).

    Args:
        hash_tokens: replace ``token_ids`` by their block hashes (:func:`with_block_hashes`), as a worker does.
        settings: how to hash (a worker: its own, from its initializer).
    """
    body = parse_json_body(raw, ScoreRequestIn)
    if isinstance(body, bytes) or not hash_tokens:
        return body
    return with_block_hashes(body, settings or _SETTINGS)


def rank_body(raw: bytes, reuse_model=None) -> tuple[int, bytes]:
    """One ``/v1/evict/rank`` body → ``(200, the ranking's JSON)`` or ``(422, the service's error body)``.

    Runs in a worker process (``reuse_model`` None: the worker's own, loaded by its initializer).
    """
    body = parse_json_body(raw, EvictRankIn)
    if isinstance(body, bytes):
        return 422, body
    try:
        ranked = rank_request(body, reuse_model if reuse_model is not None else _REUSE_MODEL)
    except FieldError as exc:
        return 422, json.dumps(field_error_body(exc.loc, exc.message)).encode()
    return 200, ranked.model_dump_json().encode()
