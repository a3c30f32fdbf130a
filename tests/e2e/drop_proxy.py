"""A ZMQ PUB→PUB relay that loses chosen KV event batches, to exercise gap detection and replay.

vLLM publishes each KV event batch as ``[topic, seq (8 bytes big-endian), payload]``. The proxy
subscribes to an engine's PUB socket and republishes every message unchanged on its own PUB socket,
except the ones it drops. A subscriber connected to :attr:`DropProxy.endpoint` then sees a gap in
the sequence numbers and must fetch the missing batch from the engine's replay socket (which the
proxy does not touch)::

    proxy = DropProxy(engine.kv_events_endpoint)
    proxy.start()                      # connect the subscriber to proxy.endpoint after this
    proxy.arm()                        # lose the next batch
    send_request(...)                  # its KV events are dropped
    dropped = proxy.wait_dropped(10)   # [seq] of the lost batch
    send_request(...)                  # the next batch reveals the gap → replay
    proxy.stop()

Standard library and pyzmq only.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import zmq

_HANDSHAKE_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_CONNECTED


class DropProxy:
    """Relay an engine's KV event PUB stream, dropping chosen batches.

    Args:
        upstream: the engine's PUB endpoint to connect to (``tcp://127.0.0.1:P``).
        drop_seqs: sequence numbers of live batches to drop (as published by the engine).
        bind: where the proxy's PUB socket binds; the default picks a free port (see :attr:`endpoint`).
        poll_interval_s: longest wait of the relay loop; bounds :meth:`stop`'s latency (seconds).

    Counters (read at any time): :attr:`forwarded` and :attr:`dropped` (messages), and
    :attr:`dropped_seqs` (the dropped batches' sequence numbers, in order).
    """

    def __init__(
        self,
        upstream: str,
        drop_seqs: Iterable[int] = (),
        bind: str = "tcp://127.0.0.1:*",
        poll_interval_s: float = 0.05,
    ) -> None:
        self.upstream = upstream
        self.drop_seqs = set(drop_seqs)
        self.bind = bind
        self.poll_interval_s = poll_interval_s
        self.forwarded = 0
        self.dropped = 0
        self.dropped_seqs: list[int] = []
        self.last_seq: int | None = None
        self._armed = 0
        self._lock = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._context: zmq.Context | None = None
        self._endpoint: str | None = None

    @property
    def endpoint(self) -> str:
        """The proxy's PUB endpoint for subscribers to connect to (``tcp://127.0.0.1:<port>``).

        Raises:
            RuntimeError: before :meth:`start`.
        """
        if self._endpoint is None:
            raise RuntimeError("DropProxy not started")
        return self._endpoint

    def arm(self, count: int = 1) -> None:
        """Drop the next ``count`` live batches (in addition to :attr:`drop_seqs`)."""
        with self._lock:
            self._armed += count

    def wait_dropped(self, timeout_s: float, count: int = 1) -> list[int]:
        """Wait until at least ``count`` batches have been dropped in all; returns :attr:`dropped_seqs`.

        Raises:
            TimeoutError: fewer than ``count`` drops within ``timeout_s`` seconds.
        """
        with self._lock:
            if not self._lock.wait_for(lambda: self.dropped >= count, timeout=timeout_s):
                raise TimeoutError(f"{self.dropped} of {count} batches dropped after {timeout_s} s")
            return list(self.dropped_seqs)

    def start(self, connect_timeout_s: float = 5.0) -> None:
        """Bind the PUB socket, connect to ``upstream`` and start relaying in a daemon thread.

        Returns once the upstream connection's handshake is done (or after ``connect_timeout_s``
        seconds, when the engine is not up yet: ZMQ keeps reconnecting). Subscriptions travel
        asynchronously, so allow a moment before relying on the first messages.
        """
        self._context = zmq.Context()
        sub = self._context.socket(zmq.SUB)
        pub = self._context.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.LINGER, 0)
        pub.bind(self.bind)
        self._endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        connect_and_wait(sub, self.upstream, connect_timeout_s)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(sub, pub), name="drop-proxy", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop relaying, close the sockets and terminate the ZMQ context (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._context is not None:
            self._context.term()
            self._context = None

    def _should_drop(self, seq: int) -> bool:
        """Whether to drop the live batch numbered ``seq``; consumes one armed drop when it does."""
        if seq in self.drop_seqs:
            return True
        if self._armed > 0:
            self._armed -= 1
            return True
        return False

    def _relay(self, frames: list[bytes], pub: zmq.Socket) -> None:
        """Forward or drop one message (``[topic, seq, payload]``; other shapes are forwarded)."""
        seq = int.from_bytes(frames[1], "big", signed=True) if len(frames) == 3 and len(frames[1]) == 8 else None
        with self._lock:
            if seq is not None:
                self.last_seq = seq
            if seq is not None and self._should_drop(seq):
                self.dropped += 1
                self.dropped_seqs.append(seq)
                self._lock.notify_all()
                return
            self.forwarded += 1
        pub.send_multipart(frames)

    def _run(self, sub: zmq.Socket, pub: zmq.Socket) -> None:
        """Relay loop of the background thread; closes both sockets on exit."""
        poller = zmq.Poller()
        poller.register(sub, zmq.POLLIN)
        timeout_ms = int(self.poll_interval_s * 1000)
        try:
            while not self._stop.is_set():
                if poller.poll(timeout_ms):
                    self._relay(sub.recv_multipart(), pub)
        finally:
            sub.close()
            pub.close()

    def __enter__(self) -> DropProxy:
        """Start the proxy."""
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Stop the proxy."""
        self.stop()


def connect_and_wait(socket: zmq.Socket, endpoint: str, timeout_s: float) -> bool:
    """Connect ``socket`` to ``endpoint``; True once the connection is up, False after ``timeout_s`` s."""
    monitor = socket.get_monitor_socket(_HANDSHAKE_EVENTS)
    try:
        socket.connect(endpoint)
        if monitor.poll(int(timeout_s * 1000)):
            monitor.recv_multipart()
            return True
        return False
    finally:
        socket.disable_monitor()
        monitor.close(linger=0)
