"""The gateway's HTTP leg to the engines: its clients, and a request sent again when an engine closed its connection.

aiohttp rather than httpx on this leg: its HTTP parser is compiled, and a streamed request costs the
gateway's event loop about 0.8 ms of CPU against httpx's 2.2 ms (measured here: 400 streamed requests
of 18 SSE events, 8 at a time, client process CPU time). The scraper's ``GET /metrics`` (httpx) sends
again in the same case: ``serving.engines.engine_metrics``.
"""

from __future__ import annotations

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
    return aiohttp.ClientSession(timeout=timeout, connector=connector, auto_decompress=False)


def closed_under_request(exc: BaseException) -> bool:
    """Whether ``exc`` says that an open connection was closed before the response head arrived.

    True for aiohttp's failures to write the request (``ClientOSError``), a reset, and a server that
    disconnected before answering (``ServerDisconnectedError``); false for a connection that could not be
    opened (``ClientConnectorError``, which subclasses ``ClientOSError``: the engine is down) and for a
    timeout (the engine is slow: sending again would add to its load).
    """
    closed = (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError, aiohttp.ClientConnectionResetError)
    return isinstance(exc, closed) and not isinstance(exc, aiohttp.ClientConnectorError)


async def post(
    client: aiohttp.ClientSession, fresh_client: aiohttp.ClientSession, url: str, data: bytes, headers: dict[str, str]
) -> tuple[aiohttp.ClientResponse, str | None]:
    """POST ``data`` to ``url`` and read the response head; once more on a new connection if the first closed.

    A pooled connection the engine closed under the request (:func:`closed_under_request`) is no failure
    of the engine. An HTTP server closes a kept-alive connection idle for its keep-alive timeout
    (uvicorn's, so vLLM's server: 5 s). The gateway drops its idle connections after 2 s, but one that
    read a response's end late (its event loop busy, its process starved of CPU) can hold a connection
    that the engine closes as it is reused. RFC 9112 §9.3.1 lets a client send a request again on a new
    connection after such a close when the request is idempotent in effect; a completion changes nothing
    on the engine but its cache, so sending it twice costs compute only (and the engine aborts the first
    when its connection closes). Go's ``net/http`` likewise sends again a request whose reused
    connection the server closed.

    Args:
        client: the pooled client; fresh_client: one without a pool (a new connection per request).

    Returns:
        The response (head read, body not), and the failure of the first try (one line) or ``None``.

    Raises:
        aiohttp.ClientError, TimeoutError: the first try failed otherwise, or the second failed.
    """
    try:
        return await client.post(url, data=data, headers=headers), None
    except aiohttp.ClientError as exc:
        if not closed_under_request(exc):
            raise
        return await fresh_client.post(url, data=data, headers=headers), one_line(exc)
