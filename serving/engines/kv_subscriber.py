"""Receive vLLM KV events over ZMQ in a thread and apply them to the cache directory (docs/architecture.md §7).

vLLM's ``ZmqEventPublisher`` (``vllm/distributed/kv_events.py``) publishes on a PUB
socket (``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": "..."}'``;
with data parallelism, rank ``r`` adds ``r`` to both ports) and serves its last
``buffer_steps`` batches on a ROUTER socket: a client sends the first sequence
number it wants as 8 bytes big-endian (after an empty delimiter frame) and gets
back one ``[seq, payload]`` message per buffered batch from that number on,
then ``[-1 as 8 signed bytes, b""]`` (vLLM ≥ 0.32 adds the topic before the sequence
number: :func:`replay_reply` reads both layouts).

:class:`KVEventSubscriber` connects one SUB socket per engine endpoint (the
worker is known from the socket) and/or binds one SUB socket that many engines
connect their PUB sockets to (the worker is known from the message topic, so
each such engine needs its own topic). A DEALER socket per worker with a replay
endpoint serves the :class:`~kvcost.serving.engines.kv_events.KVEventIngestor`'s replay
requests.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import zmq

from kvcost.serving.engines.kv_events import END_OF_REPLAY_SEQ, IngestStats, KVEventIngestor

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KVEventSource:
    """One engine's KV event stream.

    Attributes:
        worker_id: the worker the events describe.
        endpoint: the engine's PUB endpoint to connect to (``tcp://host:port``); ``None``
            when the engine connects to the subscriber's bound endpoint instead.
        topic: the engine's topic (vLLM ``topic``). Connected: a subscription prefix
            (``""`` = everything). Bound: identifies the worker, so it must be unique.
        replay_endpoint: the engine's replay ROUTER endpoint, or ``None`` (then a gap
            marks the worker's entries stale).
    """

    worker_id: int
    endpoint: str | None = None
    topic: str = ""
    replay_endpoint: str | None = None


class KVEventSubscriber:
    """ZMQ SUB client feeding a :class:`KVEventIngestor` from a background thread.

    Args:
        ingestor: applies the messages to its directory. When any source has a replay
            endpoint, the subscriber installs itself as ``ingestor.replay``.
        sources: the engines' streams.
        bind: endpoint to bind a SUB socket to (``tcp://127.0.0.1:5557``; ``tcp://127.0.0.1:*``
            for an OS-assigned port, then read :attr:`bound_endpoint`), for the sources
            without an ``endpoint``; ``None`` when every source is connected to.
        clock: time source for the ``now_s`` stamps of applied events (seconds).
        replay_timeout_s: a replay gives up when no reply arrives for this long.
        poll_interval_s: longest wait of the receive loop; bounds :meth:`stop`'s latency.
        context: ZMQ context; ``None`` creates one, terminated by :meth:`stop`.

    Raises:
        ValueError: no source; a source without endpoint but no ``bind``; two bound
            sources with the same topic; a replay callback is already set on the ingestor.

    Thread safety: the directory and the ingestor are not thread-safe. The background
    thread applies every message while holding :attr:`lock`; any other thread that
    reads the directory (``match``) or the stats must hold :attr:`lock` too. During a
    replay round trip the thread releases :attr:`lock` (nothing of the batch that
    revealed the gap is applied yet), so readers wait at most one message's ingestion.
    ZMQ sockets are created by :meth:`start` and then used by the background thread only.
    """

    def __init__(
        self,
        ingestor: KVEventIngestor,
        sources: Sequence[KVEventSource],
        bind: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        replay_timeout_s: float = 0.5,
        poll_interval_s: float = 0.05,
        context: zmq.Context | None = None,
        lock: threading.Lock | None = None,
    ) -> None:
        if not sources:
            raise ValueError("sources is empty, expected at least one KVEventSource")
        bound = [s for s in sources if s.endpoint is None]
        if bound and bind is None:
            raise ValueError(f"worker {bound[0].worker_id} has no endpoint and bind is None")
        topics = [s.topic for s in bound]
        if len(set(topics)) != len(topics):
            raise ValueError(f"bound sources need distinct topics, got {topics}")
        replays = {s.worker_id: s.replay_endpoint for s in sources if s.replay_endpoint is not None}
        if replays:
            if ingestor.replay is not None:
                raise ValueError("the ingestor already has a replay callback")
            ingestor.replay = self._replay
        self.ingestor = ingestor
        self.lock = lock if lock is not None else threading.Lock()
        self.unknown_topic_messages = 0
        self.bound_endpoint: str | None = None
        self._sources = tuple(sources)
        self._bind = bind
        self._replay_endpoints = replays
        self._clock = clock
        self._replay_timeout_ms = max(1, round(replay_timeout_s * 1000))
        self._poll_ms = max(1, round(poll_interval_s * 1000))
        self._own_context = context is None
        self._context = context
        self._subs: dict[zmq.Socket, int | None] = {}  # socket -> worker (None: bound, worker by topic)
        self._worker_of_topic = {s.topic.encode(): s.worker_id for s in bound}
        self._replay_sockets: dict[int, zmq.Socket] = {}
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    @property
    def stats(self) -> IngestStats:
        """The ingestor's counters (read them under :attr:`lock`)."""
        return self.ingestor.stats

    def start(self) -> None:
        """Create and connect / bind the sockets, then start the receive thread.

        Raises:
            RuntimeError: already started.
            zmq.ZMQError: an endpoint cannot be bound or connected.
        """
        if self._thread is not None:
            raise RuntimeError("KVEventSubscriber already started")
        if self._context is None:
            self._context = zmq.Context()
        try:
            for source in self._sources:
                if source.endpoint is not None:
                    sock = self._sub_socket([source.topic])
                    sock.connect(source.endpoint)
                    self._subs[sock] = source.worker_id
            if self._worker_of_topic:
                sock = self._sub_socket([s.topic for s in self._sources if s.endpoint is None])
                sock.bind(self._bind)
                self.bound_endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
                self._subs[sock] = None
            for worker_id, endpoint in self._replay_endpoints.items():
                sock = self._context.socket(zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(endpoint)
                self._replay_sockets[worker_id] = sock
        except Exception:
            self._close()
            raise
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="kvcost-kv-events", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the receive thread, wait for it (at most ``timeout_s``) and close the sockets. Idempotent."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stopping.set()
        thread.join(timeout_s)
        if thread.is_alive():
            logger.error("KV event thread did not stop within %.1f s; sockets left open", timeout_s)
            return
        self._close()

    def __enter__(self) -> KVEventSubscriber:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _sub_socket(self, topics: Sequence[str]) -> zmq.Socket:
        sock = self._context.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 100_000)  # vLLM's PUB high-water mark
        for topic in topics:
            sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self._subs[sock] = None  # registered before connect/bind so _close() sees it on failure
        return sock

    def _close(self) -> None:
        for sock in [*self._subs, *self._replay_sockets.values()]:
            sock.close(linger=0)
        self._subs.clear()
        self._replay_sockets.clear()
        if self._own_context and self._context is not None:
            self._context.term()
            self._context = None

    def _run(self) -> None:
        poller = zmq.Poller()
        for sock in self._subs:
            poller.register(sock, zmq.POLLIN)
        while not self._stopping.is_set():
            try:
                ready = poller.poll(self._poll_ms)
            except zmq.ZMQError:
                logger.exception("KV event poll failed; receive thread stops")
                return
            for sock, _ in ready:
                try:
                    self._drain(sock)
                except Exception:  # the thread must outlive any one message (e.g. a failing clock)
                    logger.exception("KV event handling failed")

    def _drain(self, sock: zmq.Socket, max_messages: int = 1024) -> None:
        """Ingest up to ``max_messages`` waiting messages of ``sock`` (then let other sockets have a turn)."""
        for _ in range(max_messages):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError:
                logger.exception("KV event receive failed")
                return
            worker_id = self._subs.get(sock)
            if worker_id is None:
                worker_id = self._worker_of_topic.get(frames[0])
                if worker_id is None:
                    with self.lock:
                        self.unknown_topic_messages += 1
                    continue
            with self.lock:
                self.ingestor.ingest(worker_id, frames, self._clock())

    def _replay(self, worker_id: int, from_seq: int) -> list[tuple[int, bytes]]:
        """Replay callback of the ingestor: the engine's buffered batches from ``from_seq`` on.

        Runs on the receive thread, inside ``ingest`` (so with :attr:`lock` held); the
        lock is released during the round trip. Returns what arrived before the end
        marker or the timeout.
        """
        sock = self._replay_sockets.get(worker_id)
        if sock is None or threading.current_thread() is not self._thread:
            return []
        self.lock.release()
        try:
            return self._fetch_replay(sock, worker_id, from_seq)
        finally:
            self.lock.acquire()

    def _fetch_replay(self, sock: zmq.Socket, worker_id: int, from_seq: int) -> list[tuple[int, bytes]]:
        while sock.poll(0):  # leftovers of an earlier replay that timed out
            sock.recv_multipart()
        try:
            sock.send_multipart([b"", from_seq.to_bytes(8, "big")], zmq.NOBLOCK)
        except zmq.ZMQError as err:
            logger.warning("worker %s: replay request failed: %s", worker_id, err)
            return []
        batches = []
        while sock.poll(self._replay_timeout_ms):
            reply = replay_reply(sock.recv_multipart())
            if reply is None:
                logger.warning("worker %s: malformed replay reply", worker_id)
                continue
            if reply[0] < 0:
                return batches
            batches.append(reply)
        logger.warning("worker %s: replay from %d timed out after %d batches", worker_id, from_seq, len(batches))
        return batches


def replay_reply(frames: Sequence[bytes]) -> tuple[int, bytes] | None:
    """``(seq, payload)`` of one replay reply as a DEALER receives it; ``seq`` = −1 for the end marker.

    Two layouts: vLLM ≥ 0.32 (``ZmqEventPublisher._service_replay`` sends the topic too)
    ``[b"", topic, seq, payload]`` with end marker ``[b"", b"", −1, b""]``; earlier
    releases ``[b"", seq, payload]`` with end marker ``[b"", −1, b""]``. ``seq`` is 8 bytes
    big-endian (signed for the marker). Returns None for any other shape.
    """
    if len(frames) == 4:
        frames = (frames[0], frames[2], frames[3])
    if len(frames) != 3 or frames[0] != b"" or len(frames[1]) != 8:
        return None
    _, seq_frame, payload = frames
    if seq_frame == END_OF_REPLAY_SEQ:
        return -1, b""
    return int.from_bytes(seq_frame, "big"), payload
