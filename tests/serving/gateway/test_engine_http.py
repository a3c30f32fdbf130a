"""Tests for kvcost.serving.gateway.engine_http: a request sent again when an engine closes its connection,
against a real socket server (the gateway's whole engine leg runs against real vLLM engines: tests/e2e)."""

import asyncio

import aiohttp
import pytest

from kvcost.serving.gateway.engine_http import closed_under_request, engine_client, post
from kvcost.serving.settings import ServiceSettings
from tests.serving.gateway.closing_server import ClosingServer


async def _post_twice(server: ClosingServer, retries: list[str]) -> list[tuple[int, str]]:
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
    server, retries = ClosingServer(), []
    out = asyncio.run(_post_twice(server, retries))
    assert out == [(200, "ok"), (200, "ok")]
    assert retries == ["ServerDisconnectedError: Server disconnected"]
    assert (server.connections, server.answered) == (2, 2)  # the pooled one, then the new one


def test_a_new_connection_the_engine_closes_is_its_failure_not_retried():
    server, retries = ClosingServer(answer_none=True), []
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
