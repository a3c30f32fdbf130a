"""Tests for kvcost.serving.gateway.sse: event splitting, usage trimming, OpenAI's error shape."""

import json

from kvcost.serving.gateway.sse import (
    EventReader,
    OpenAIError,
    cached_tokens,
    completion_tokens,
    queue_time_s,
    without_usage,
)

CHUNK = {"id": "c1", "choices": [{"index": 0, "text": "hi"}], "usage": None}
USAGE = {"prompt_tokens": 70, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 64}}


def sse(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def test_events_are_split_at_blank_lines_across_reads_and_line_endings():
    reader = EventReader()
    stream = sse(CHUNK) + b'data: {"choices": [], "usage": ' + json.dumps(USAGE).encode() + b"}\r\n\r\n"
    stream += b": keep-alive comment\n\ndata: [DONE]\n\n"
    events = []
    for i in range(0, len(stream), 7):  # 7-byte reads: events end mid-read
        events += reader.feed(stream[i : i + 7])
    assert [e.has_choices for e in events] == [True, False, False, False]
    assert [e.done for e in events] == [False, False, False, True]
    assert events[1].chunk["usage"] == USAGE and events[2].chunk is None
    assert b"".join(e.raw for e in events) == stream and reader.pending == b""


def test_a_client_that_did_not_ask_for_usage_gets_none():
    reader = EventReader()
    chunk, usage_only, done = reader.feed(sse(CHUNK) + sse({"choices": [], "usage": USAGE}) + b"data: [DONE]\n\n")
    assert json.loads(without_usage(chunk)[6:]) == {"id": "c1", "choices": [{"index": 0, "text": "hi"}]}
    assert without_usage(usage_only) is None
    assert without_usage(done) == b"data: [DONE]\n\n"


def test_usage_fields_are_read_only_when_well_formed():
    assert (cached_tokens(USAGE), completion_tokens(USAGE)) == (64, 3)
    assert cached_tokens({"prompt_tokens_details": None}) is None  # engine without --enable-prompt-tokens-details
    assert cached_tokens({"prompt_tokens_details": {"cached_tokens": -1}}) is None
    assert (cached_tokens(None), completion_tokens({"completion_tokens": "3"})) == (None, None)
    assert queue_time_s({"metrics": {"queue_time_ms": 125.0, "time_to_first_token_ms": 15.6}}) == 0.125
    assert queue_time_s({"metrics": None}) is None  # an engine without --enable-per-request-metrics
    assert queue_time_s({"metrics": {"queue_time_ms": -1}}) is None


def test_openai_error_shape_and_stream_event():
    error = OpenAIError(502, "engine 1 (http://e1) failed mid-stream", "engine_error")
    body = {"error": {"message": "engine 1 (http://e1) failed mid-stream", "type": "engine_error", "param": None,
                      "code": 502}}  # fmt: skip
    assert error.body() == body
    first, second = EventReader().feed(error.event())
    assert first.chunk == body and second.done
