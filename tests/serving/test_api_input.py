"""Tests for kvcost.serving.api: what the wire accepts as a body (strict numbers, JSON Schema's integers,
undecodable bodies), each error a 422 in the service's shape naming the field (tests/serving/test_api.py
holds the endpoints themselves)."""

import json

import pytest
from fastapi.testclient import TestClient

from kvcost.serving.api import create_app
from tests.serving.test_api import AUTH, _with, make_body, settings_for


@pytest.fixture
def client(tmp_path):
    with TestClient(create_app(settings_for(tmp_path))) as c:
        yield c


def test_strings_and_booleans_are_not_numbers(client):
    # kvcost issue 15: this body was once recorded, true becoming 1.0 s and "0.25" 0.25 s
    body = {"request_id": 55, "ttft_s": "0.25", "prefill_s": True, "queue_s": "1e-3", "e2e_s": False}
    response = client.post("/v1/observe", json=body, headers=AUTH)
    assert response.status_code == 422
    assert sorted(d["loc"][-1] for d in response.json()["detail"]) == ["e2e_s", "prefill_s", "queue_s", "ttft_s"]
    assert sorted(d["msg"] for d in response.json()["detail"]) == [
        "Input should be a valid number, got '0.25'",
        "Input should be a valid number, got '1e-3'",
        "Input should be a valid number, got False",
        "Input should be a valid number, got True",
    ]
    snapshot = _with(make_body(), ("candidates", 0, "snapshot", "recent_step_nominal_s"), False)
    response = client.post("/v1/score", json=snapshot)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "candidates", 0, "snapshot", "recent_step_nominal_s"]
    assert client.post("/v1/observe", json={"request_id": 55, "ttft_s": 1}, headers=AUTH).status_code != 422


def test_integral_floats_are_integers_and_the_eviction_policy_is_an_enum(client):
    # JSON Schema counts 59.0 as an integer, so the published "type": "integer" admits it
    body = make_body()
    body["request"]["request_id"] = 59.0
    assert client.post("/v1/score", json=body).status_code == 200
    body["request"]["token_ids"] = [1.0, 2, 3.0] + list(range(3, 100))  # a list is checked in one pass
    assert client.post("/v1/score", json=body).status_code == 200
    body["request"]["token_ids"] = [1, 2.5, True]
    errors = client.post("/v1/score", json=body).json()["detail"]
    assert [e["loc"][-1] for e in errors] == [1, 2]  # 2.5 and true are not token ids
    policy = client.get("/openapi.json").json()["components"]["schemas"]["EvictRankIn"]["properties"]["policy"]
    assert sorted(policy["enum"]) == ["cost_aware", "flop_aware", "gdsf", "lfu", "lhd", "lru"]


def test_malformed_json_is_422_saying_where(client):
    response = client.post("/v1/score", content='{"request": ', headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body"]
    assert response.json()["message"] == "body is not valid JSON (EOF while parsing a value at line 1 column 12)"


@pytest.mark.parametrize("path", ["/v1/observe", "/v1/score"])  # every JSON body is read by pydantic's parser
def test_bodies_that_cannot_be_decoded_are_422_saying_why(client, path):
    # FastAPI answered these with an undocumented 400 "There was an error parsing the body" (kvcost issue 15)
    utf8, deep = "invalid unicode code point at line 1 column 14", "recursion limit exceeded at line 1 column 202"
    headers = {"content-type": "application/json", **AUTH}
    bad_utf8 = client.post(path, content=b'{"request": "\xff"}', headers=headers)
    nested = client.post(path, content="[" * 1000 + "]" * 1000, headers=headers)
    assert (bad_utf8.status_code, nested.status_code) == (422, 422)
    assert bad_utf8.json()["message"] == f"body is not valid JSON ({utf8})"
    assert nested.json()["detail"] == [
        {"loc": ["body"], "msg": f"body is not valid JSON ({deep})", "type": "json_invalid"}
    ]
    assert client.get("/v1/nowhere").status_code == 404  # other HTTP errors keep FastAPI's answer


def test_non_finite_numbers_are_422(client):
    text = json.dumps(make_body()).replace('"snapshot": {}', '"snapshot": {"recent_step_s": NaN}')
    response = client.post("/v1/score", content=text, headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "candidates", 1, "snapshot", "recent_step_s"]
    assert response.json()["detail"][0]["msg"] == "Input should be a finite number, got nan"
    observation = '{"request_id": 1, "ttft_s": Infinity}'
    response = client.post("/v1/observe", content=observation, headers={"content-type": "application/json"} | AUTH)
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "ttft_s"]
