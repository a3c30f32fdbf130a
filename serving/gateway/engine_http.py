"""The gateway's HTTP leg to the engines: its clients, and a request sent again when an engine closed its connection.

aiohttp rather than httpx on this leg: its HTTP parser is compiled, and a streamed request costs the
gateway's event loop about 0.8 ms of CPU against httpx's 2.2 ms (measured here: 400 streamed requests
of 18 SSE events, 8 at a time, client process CPU time). The scraper's ``GET /metrics`` (httpx) sends
again in the same case: ``serving.engines.engine_metrics``.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import aiohttp

from kvcost.serving.model_loading import one_line
from kvcost.serving.settings import ServiceSettings


def engine_client(settings: ServiceSettings, fresh: bool = False) -> aiohttp.ClientSession:
    """The gateway's client to the engines: connect and read timeouts from the settings, no pool limit.

    Call it inside the event loop.

    Args:
        settings: the engine timeouts (``engine_connect_timeout_s``, ``engine_read_timeout_s``).
        fresh: a new connection per request (no pool): the client for a request sent again after an
            engine closed a pooled connection under it (:func:`post`).
    """
    timeout = aiohttp.ClientTimeout(
        total=None, connect=settings.engine_connect_timeout_s, sock_read=settings.engine_read_timeout_s
    )
    # idle connections are closed before the engine's own keep-alive timeout (uvicorn's 5 s, vLLM's server):
    # that narrows, but cannot close, the race with an engine closing one as it is reused (:func:`post`)
    connector = aiohttp.TCPConnector(limit=0, force_close=fresh, keepalive_timeout=None if fresh else 2.0)
    traces = None if fresh else [_reuse_trace()]
    return aiohttp.ClientSession(timeout=timeout, connector=connector, auto_decompress=False, trace_configs=traces)


def closed_under_request(exc: BaseException) -> bool:
    """Whether ``exc`` says that an open connection was closed before the response head arrived.

    True for aiohttp's failures to write the request (``ClientOSError``), a reset, and a server that
    disconnected before answering (``ServerDisconnectedError``), as aiohttp's own retry of idempotent
    requests reads them. False for a connection that could not be opened (``ClientConnectorError``,
    which subclasses ``ClientOSError``: the engine is down) and for a timeout (the engine is slow:
    sending again would add to its load).
    """
    closed = (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError, aiohttp.ClientConnectionResetError)
    return isinstance(exc, closed) and not isinstance(exc, aiohttp.ClientConnectorError)


async def post(
    client: aiohttp.ClientSession,
    fresh_client: aiohttp.ClientSession,
    url: str,
    data: bytes,
    headers: dict[str, str],
    on_retry: Callable[[str], None] | None = None,
) -> aiohttp.ClientResponse:
    """POST ``data`` to ``url`` and read the response head; once more on a new connection if a reused one closed.

    A pooled connection the engine closed under the request is no failure of the engine. An HTTP server
    closes a kept-alive connection idle for its keep-alive timeout (uvicorn's, so vLLM's server: 5 s).
    The gateway drops its idle connections after 2 s, but one that read a response's end late (its
    event loop busy, its process starved of CPU) can hold a connection that the engine closes as it
    is reused. So a request whose connection came from the pool (``client`` must come from
    :func:`engine_client`, whose trace hook tells) and closed before the response head
    (:func:`closed_under_request`) is sent once more on a new connection, to the same engine. A new
    connection that closes so is the engine's failure (the caller routes elsewhere).

    Why it is safe, though a POST: RFC 9110 §9.2.2 lets a client send a request again when it knows
    the request to be idempotent in effect or never applied. An engine that closes an idle connection
    has not read the request sent on it; one that closed it mid-request aborts the request (vLLM does
    when its connection closes), and a completion changes nothing on the engine but its cache, so a
    second send costs compute only. Go's ``net/http`` sends a POST again on a reused connection only
    when nothing of it was written; this rule is broader, and logged (``on_retry``).

    Args:
        client: the pooled client; fresh_client: one without a pool (a new connection per request).
        on_retry: called with the first try's failure (one line) before the second.

    Returns:
        The response: its head read, its body not.

    Raises:
        aiohttp.ClientError, TimeoutError: the first try failed otherwise, or the second failed.
    """
    reuse = _Reuse()
    try:
        return await client.post(url, data=data, headers=headers, trace_request_ctx=reuse)
    except aiohttp.ClientError as exc:
        if not (reuse.reused and closed_under_request(exc)):
            raise
        if on_retry is not None:
            on_retry(one_line(exc))
        return await fresh_client.post(url, data=data, headers=headers)


class _Reuse:
    """A request's trace context: whether its connection came from the pool (:func:`post`)."""

    __slots__ = ("reused",)

    def __init__(self) -> None:
        self.reused = False


async def _on_reuse(
    session: aiohttp.ClientSession, context: SimpleNamespace, params: aiohttp.TraceConnectionReuseconnParams
) -> None:
    if isinstance(context.trace_request_ctx, _Reuse):
        context.trace_request_ctx.reused = True


def _reuse_trace() -> aiohttp.TraceConfig:
    """A trace config that marks a :class:`_Reuse` context when the request's connection is reused."""
    trace = aiohttp.TraceConfig()
    trace.on_connection_reuseconn.append(_on_reuse)
    return trace
