"""Tests for kvcost.serving.gateway.proxy's pure parts (the proxy itself runs against real engines: tests/e2e)."""

import asyncio

import pytest
from starlette.requests import Request

from kvcost.serving.gateway.proxy import CLIENT_CLOSED_REQUEST, _json_body, engine_cached_tokens
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
