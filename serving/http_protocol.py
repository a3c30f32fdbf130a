"""uvicorn's HTTP/1.1 protocol (httptools) with the read timeouts it lacks: request head and request body.

uvicorn closes idle keep-alive connections (``--keep-alive-timeout-s``) but holds
a connection that sent part of a request head, or a head and part of a body,
forever: 1,500 connections that sent their headers and one body byte were held
for over 20 s (kvcost issue 15), each pinning a socket and, once the app reads
the body, a task. Slow clients are bounded here instead:

* **head**: a request's head (request line and headers) must arrive within
  ``head_timeout_s`` of its first byte, or of the connection's opening for a
  connection that sends nothing (uvicorn arms no timer on such a connection);
* **body**: its body must arrive within ``body_timeout_s`` of the head's end.

Past either, the connection is closed, with a warning that names the client, the
stage and the timeout; a request still without a response gets ``408 Request
Timeout`` first. The timer is cancelled when the request is
complete, so the time the application takes to answer is not limited here.

**Concurrency**: while ``max_concurrency`` connections or requests are open, a new
request is answered 503 with ``Retry-After: 1`` (uvicorn's ``--limit-concurrency``
does the same, in plain text; this one is the service's JSON error body).
Thread safety: the event loop only, as uvicorn's protocol.
"""

from __future__ import annotations

import asyncio
import json
import logging

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

logger = logging.getLogger(__name__)

_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
)


class TimedHttpToolsProtocol(HttpToolsProtocol):
    """:class:`HttpToolsProtocol` with head and body read timeouts (class attributes; see :func:`timed_protocol`)."""

    head_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    max_concurrency: int = 2048

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._read_timer: asyncio.TimerHandle | None = None
        self._arm("head", self.head_timeout_s)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._read_timer is None:  # a new request on a kept-alive connection
            self._arm("head", self.head_timeout_s)

    def on_headers_complete(self) -> None:
        # this connection is among ``connections``; this request is not yet among ``tasks``
        if len(self.connections) > self.max_concurrency or len(self.tasks) >= self.max_concurrency:
            app, self.app = self.app, _over_limit  # this request only
            try:
                super().on_headers_complete()
            finally:
                self.app = app
        else:
            super().on_headers_complete()
        self._arm("body", self.body_timeout_s)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, stage: str, timeout_s: float) -> None:
        self._disarm()
        self._read_timer = self.loop.call_later(timeout_s, self._timed_out, stage, timeout_s)

    def _disarm(self) -> None:
        timer, self._read_timer = getattr(self, "_read_timer", None), None
        if timer is not None:
            timer.cancel()

    def _timed_out(self, stage: str, timeout_s: float) -> None:
        self._read_timer = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        reason = f"request {stage} not received within {timeout_s:g} s"
        logger.warning("closed a connection from %s: %s", self.client, reason)
        if cycle is None or not cycle.response_started:
            text = json.dumps({"detail": reason}).encode()
            self.transport.write(_TIMEOUT % len(text) + text)  # the service's error body (ErrorOut)
        self.transport.close()


async def _over_limit(scope, receive, send) -> None:
    """The 503 of a request past the concurrency limit, in the service's error body."""
    body = json.dumps({"detail": "too many open connections or requests; retry after 1 s"}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers.append((b"retry-after", b"1"))
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def timed_protocol(
    head_timeout_s: float, body_timeout_s: float, max_concurrency: int = 2048
) -> type[TimedHttpToolsProtocol]:
    """A :class:`TimedHttpToolsProtocol` class with these timeouts (seconds, > 0) and concurrency limit (≥ 1),
    for ``uvicorn.run(http=…)``.

    Raises:
        ValueError: a timeout ≤ 0 or a limit < 1 (names it).
    """
    for name, value in (("head_timeout_s", head_timeout_s), ("body_timeout_s", body_timeout_s)):
        if not value > 0:
            raise ValueError(f"{name} = {value!r}, expected seconds > 0")
    if not max_concurrency >= 1:
        raise ValueError(f"max_concurrency = {max_concurrency!r}, expected ≥ 1")
    attributes = {"head_timeout_s": head_timeout_s, "body_timeout_s": body_timeout_s}
    attributes["max_concurrency"] = max_concurrency
    return type("TimedHttpToolsProtocol", (TimedHttpToolsProtocol,), attributes)
