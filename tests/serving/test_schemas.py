"""Tests of kvcost.serving.schemas: the wire models' limits, at and just past each boundary."""

import pytest
from pydantic import ValidationError

from kvcost.serving.schemas import (
    MAX_CANDIDATES,
    MAX_TOKENS,
    ObservationIn,
    RequestIn,
    ScoreRequestIn,
    SnapshotIn,
)

NS = {"model": "m"}


def errors(model, data):
    with pytest.raises(ValidationError) as info:
        model.model_validate(data)
    return [(e["loc"], e["msg"]) for e in info.value.errors()]


def test_limits_hold_exactly_at_the_boundary():
    candidates = [{"worker_id": i} for i in range(MAX_CANDIDATES)]
    body = {"request": {"request_id": 0, "namespace": NS, "block_hashes": [], "input_tokens": MAX_TOKENS}}
    assert len(ScoreRequestIn.model_validate(body | {"candidates": candidates}).candidates) == MAX_CANDIDATES
    too_many = candidates + [{"worker_id": MAX_CANDIDATES}]
    assert errors(ScoreRequestIn, body | {"candidates": too_many})[0][0] == ("candidates",)
    over = {"request_id": 0, "namespace": NS, "block_hashes": [], "input_tokens": MAX_TOKENS + 1}
    assert errors(RequestIn, over)[0][0] == ("input_tokens",)


def test_token_ids_give_the_input_length():
    request = RequestIn.model_validate({"request_id": 1, "namespace": NS, "token_ids": [5, 6, 7]})
    assert (request.input_tokens, request.block_hashes, request.namespace.block_size_tokens) == (None, None, None)
    assert RequestIn.model_validate({"request_id": 1, "namespace": NS, "token_ids": [5], "input_tokens": 1})
    assert errors(RequestIn, {"request_id": 1, "namespace": NS, "token_ids": []})[0][0] == ("token_ids",)
    assert errors(RequestIn, {"request_id": 1, "namespace": NS, "token_ids": [2**32]})[0][0] == ("token_ids", 0)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, "give exactly one of token_ids or block_hashes"),
        ({"token_ids": [1], "block_hashes": [1]}, "give exactly one of token_ids or block_hashes"),
        ({"block_hashes": [1]}, "input_tokens is required with block_hashes"),
        ({"token_ids": [1, 2], "input_tokens": 3}, "input_tokens = 3 but token_ids has 2 tokens"),
    ],
)
def test_prompt_forms(fields, message):
    [(loc, msg)] = errors(RequestIn, {"request_id": 1, "namespace": NS} | fields)
    assert loc == () and msg == f"Value error, {message}"


def test_integers_are_strict_and_unknown_fields_refused():
    assert SnapshotIn.model_validate({"running_requests": 1.0}).running_requests == 1  # JSON Schema: an integer
    assert errors(SnapshotIn, {"running_requests": 1.5})[0] == (
        ("running_requests",),
        "Input should be a valid integer",
    )
    assert errors(SnapshotIn, {"running_requests": "1"})[0][0] == ("running_requests",)
    assert errors(SnapshotIn, {"running_requests": True})[0][0] == ("running_requests",)
    assert errors(SnapshotIn, {"runing_requests": 1})[0] == (("runing_requests",), "Extra inputs are not permitted")
    assert SnapshotIn.model_validate({"recent_step_s": 1}).recent_step_s == 1.0  # an integer is a number


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1e-9, 1e6 + 1])
def test_seconds_are_finite_non_negative_and_bounded(value):
    assert errors(ObservationIn, {"request_id": 1, "ttft_s": value})[0][0] == ("ttft_s",)


def test_openapi_schema_states_the_prompt_forms():
    schema = RequestIn.model_json_schema()
    assert [form["required"] for form in schema["oneOf"]] == [["token_ids"], ["block_hashes", "input_tokens"]]
    assert schema["additionalProperties"] is False
