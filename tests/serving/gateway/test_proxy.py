"""Tests for kvcost.serving.gateway.proxy's parts (the proxy itself runs against real engines: tests/e2e)."""

import asyncio

import aiohttp
import pytest
from starlette.requests import Request

from kvcost.serving.gateway.proxy import (
    CLIENT_CLOSED_REQUEST,
    _json_body,
    closed_under_request,
    engine_cached_tokens,
    post,
)
from kvcost.serving.gateway.sse import OpenAIError


def _request(*messages: dict) -> Request:
    """A POST whose ASGI ``receive`` hands out ``messages`` in order."""
    queue = list(messages)

    async def receive() -> dict:
        return queue.pop(0)

    return Request({"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}, receive)


def test_a_client_that_leaves_before_its_body_arrives_gets_a_handled_499_not_a_crash():
    request = _request({"type": "http.request", "body": b'{"prompt": ', "more_body": True}, {"type": "http.disconnect"})
    with pytest.raises(OpenAIError) as raised:
        asyncio.run(_json_body(request))
    assert (raised.value.status, raised.value.message) == (
        CLIENT_CLOSED_REQUEST,
        "the client disconnected before its request body arrived",
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"[1, 2]", "the body is a JSON list, expected an object"),
        (b'{"stream": "yes"}', "stream = 'yes', expected true or false"),
    ],
)
def test_a_body_that_is_no_request_object_is_refused_by_name(body, message):
    with pytest.raises(OpenAIError) as raised:
        asyncio.run(_json_body(_request({"type": "http.request", "body": body, "more_body": False})))
    assert (raised.value.status, raised.value.message) == (400, message)


def test_a_whole_body_is_read_as_its_json_object():
    body = b'{"prompt": [1, 2], "stream": true}'
    read = asyncio.run(_json_body(_request({"type": "http.request", "body": body})))
    assert read == {"prompt": [1, 2], "stream": True}


@pytest.mark.parametrize(
    ("blocks", "input_tokens", "expected"),
    [
        (3, 200, 96),  # a prefix of 3 blocks of a longer prompt: all of it
        (6, 192, 160),  # the whole prompt cached: the last block is computed again (vLLM aligns hits to blocks)
        (6, 193, 192),  # one token past the cached blocks: every cached block counts
        (0, 50, 0),
        (1, 1, 0),
    ],
)
def test_engine_cached_tokens_caps_a_full_hit_as_vllm_does(blocks, input_tokens, expected):
    assert engine_cached_tokens(blocks, 32, input_tokens) == expected


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


async def _post_twice(server: _ClosingServer) -> list[tuple[int, str | None]]:
    url = await server.start()
    async with (
        aiohttp.ClientSession() as client,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as fresh,
    ):
        out = []
        for _ in range(2):
            response, closed = await post(client, fresh, url, b"{}", {"content-type": "application/json"})
            out.append((response.status, await response.text(), closed))
    server.server.close()
    return out


def test_a_pooled_connection_the_engine_closes_under_a_request_is_retried_once_on_a_new_connection():
    server = _ClosingServer()
    out = asyncio.run(_post_twice(server))
    assert out == [(200, "ok", None), (200, "ok", "ServerDisconnectedError: Server disconnected")]
    assert (server.connections, server.answered) == (2, 2)  # the pooled one, then the new one


def test_an_engine_that_closes_the_new_connection_too_fails_the_request():
    server = _ClosingServer(answer_none=True)
    with pytest.raises(aiohttp.ServerDisconnectedError):
        asyncio.run(_post_twice(server))
    assert (server.connections, server.answered) == (2, 0)


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
