"""Tests for kvcost.serving.gateway.engine_http: a request sent again when an engine closes its connection,
against a real socket server (the gateway's whole engine leg runs against real vLLM engines: tests/e2e)."""

import asyncio

import aiohttp
import pytest

from kvcost.serving.gateway.engine_http import closed_under_request, engine_client, post
from kvcost.serving.settings import ServiceSettings


class _ClosingServer:
    """An HTTP/1.1 server on a real socket that answers the first request of each connection and closes
    the connection when a second request arrives on it, unanswered: what an engine's keep-alive timeout
    does to a pooled connection at the moment it is reused. ``answer_none`` closes every connection so."""

    def __init__(self, answer_none: bool = False) -> None:
        self.answer_none = answer_none
        self.connections = 0
        self.answered = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:  # the client closed it
                break
            length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
            await reader.readexactly(length)
            if served or self.answer_none:
                break
            served += 1
            self.answered += 1
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok")
            await writer.drain()
        writer.close()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1/completions"


async def _post_twice(server: _ClosingServer, retries: list[str]) -> list[tuple[int, str]]:
    """Two requests in turn through the gateway's clients; each retry's reason goes to ``retries``."""
    url = await server.start()
    settings = ServiceSettings()
    client, fresh = engine_client(settings), engine_client(settings, fresh=True)
    try:
        out = []
        for _ in range(2):
            response = await post(client, fresh, url, b"{}", {"content-type": "application/json"}, retries.append)
            out.append((response.status, await response.text()))
        return out
    finally:
        await client.close()
        await fresh.close()
        server.server.close()


def test_a_reused_connection_the_engine_closes_under_a_request_is_retried_once_on_a_new_connection():
    server, retries = _ClosingServer(), []
    out = asyncio.run(_post_twice(server, retries))
    assert out == [(200, "ok"), (200, "ok")]
    assert retries == ["ServerDisconnectedError: Server disconnected"]
    assert (server.connections, server.answered) == (2, 2)  # the pooled one, then the new one


def test_a_new_connection_the_engine_closes_is_its_failure_not_retried():
    server, retries = _ClosingServer(answer_none=True), []
    with pytest.raises(aiohttp.ServerDisconnectedError):
        asyncio.run(_post_twice(server, retries))
    assert (server.connections, server.answered, retries) == (1, 0, [])


@pytest.mark.parametrize(
    ("exc", "closed"),
    [
        (aiohttp.ClientOSError(None, "Can not write request body for http://e/v1/completions"), True),
        (aiohttp.ServerDisconnectedError(), True),
        (aiohttp.ClientConnectionResetError("Cannot write to closing transport"), True),
        (aiohttp.ClientConnectorError(None, ConnectionRefusedError(111, "refused")), False),  # the engine is down
        (aiohttp.ConnectionTimeoutError(), False),
        (aiohttp.SocketTimeoutError(), False),  # the engine is slow
        (aiohttp.ClientPayloadError("cut"), False),
    ],
)
def test_closed_under_request_tells_a_closed_connection_from_a_down_or_slow_engine(exc, closed):
    assert closed_under_request(exc) is closed
