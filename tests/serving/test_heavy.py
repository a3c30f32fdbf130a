"""Tests for kvcost.serving.heavy: ranking in a bounded worker-process pool, 503 + Retry-After past its queue."""

import asyncio
import json
import os
import signal

import pytest
from fastapi.testclient import TestClient

from kvcost.serving.api import create_app
from kvcost.serving.heavy import HeavyPool, PoolBusyError, rank_body
from kvcost.serving.settings import ServiceSettings
from tests.serving.heavy_bodies import forest_body
from tests.serving.test_api import AUTH, make_body, settings_for


def test_rank_body_answers_the_ranking_or_the_services_422():
    status, content = rank_body(forest_body(4, chain_blocks=2, policy="lru"))
    assert status == 200
    assert [n["node_id"] for n in json.loads(content)["nodes"]] == [3, 2, 1, 0]  # older chain first, leaf first
    status, content = rank_body(b'{"policy": "lru", "now_s": 1.0, "nodes": [{"node_id": "7"}]}')
    assert status == 422
    error = json.loads(content)
    assert error["detail"][0]["loc"] == ["body", "nodes", 0, "node_id"]
    assert error["message"].startswith("nodes.0.node_id: Input should be a valid integer")
    status, content = rank_body(b'{"policy": "lru", "now_s": 1.0, "nodes": [')
    assert (status, json.loads(content)["detail"][0]["type"]) == (422, "json_invalid")


def test_past_the_queue_limit_a_rank_is_refused_with_retry_after(tmp_path):
    settings = ServiceSettings(db_path=tmp_path / "log.duckdb", heavy_workers=1, heavy_queue_limit=1)

    async def scenario():
        pool = HeavyPool(settings, retry_after_s=2)
        try:
            body = forest_body(2000)
            first = asyncio.create_task(pool.rank(body))
            second = asyncio.create_task(pool.rank(body))
            await asyncio.sleep(0)  # both admitted: one running, one queued
            with pytest.raises(PoolBusyError, match="2 heavy requests are running or queued") as refused:
                await pool.rank(body)
            statuses = [status for status, _ in await asyncio.gather(first, second)]
            return refused.value.retry_after_s, statuses, pool.refused, pool.in_flight
        finally:
            pool.shutdown()

    assert asyncio.run(scenario()) == (2, [200, 200], 1, 0)


def test_the_api_answers_503_with_retry_after_when_the_pool_is_full(tmp_path):
    settings = ServiceSettings(db_path=tmp_path / "log.duckdb", segment_roll_interval_s=0, heavy_queue_limit=0)
    with TestClient(create_app(settings)) as client:
        client.app.state.heavy.in_flight = 1  # the one worker is busy
        answer = client.post("/v1/evict/rank", content=forest_body(3))
        client.app.state.heavy.in_flight = 0
        again = client.post("/v1/evict/rank", content=forest_body(3))
    assert (answer.status_code, answer.headers["retry-after"]) == (503, "1")
    assert "retry after 1 s" in answer.json()["detail"]
    assert again.status_code == 200 and len(again.json()["nodes"]) == 3


def test_the_openapi_document_describes_the_rank_body_and_its_503(tmp_path):
    settings = ServiceSettings(db_path=tmp_path / "log.duckdb", segment_roll_interval_s=0)
    with TestClient(create_app(settings)) as client:
        document = client.get("/openapi.json").json()
    operation = document["paths"]["/v1/evict/rank"]["post"]
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/EvictRankIn"}
    schemas = document["components"]["schemas"]
    assert schemas["EvictRankIn"]["properties"]["nodes"]["items"] == {"$ref": "#/components/schemas/EvictNodeIn"}
    assert "EvictNodeIn" in schemas and "503" in operation["responses"]


def test_the_rank_body_has_its_own_size_limit(tmp_path):
    settings = ServiceSettings(
        db_path=tmp_path / "log.duckdb", segment_roll_interval_s=0, max_body_bytes=1024, max_rank_body_bytes=4096
    )
    with TestClient(create_app(settings)) as client:
        small, large = forest_body(8), forest_body(40)
        assert 1024 < len(small) < 4096 < len(large)
        assert client.post("/v1/evict/rank", content=small).status_code == 200
        refused = client.post("/v1/evict/rank", content=large)
        other = client.post("/v1/score", content=small)
    assert (refused.status_code, refused.json()["detail"]) == (413, "request body larger than 4096 bytes")
    assert (other.status_code, other.json()["detail"]) == (413, "request body larger than 1024 bytes")


def test_a_large_score_body_is_parsed_and_hashed_in_the_pool_with_the_same_answer(tmp_path):
    answers = {}
    for threshold in (16 * 2**20, 0):  # every body on the loop, then every body in the pool
        (tmp_path / str(threshold)).mkdir()
        settings = settings_for(tmp_path / str(threshold), heavy_body_bytes=threshold)
        with TestClient(create_app(settings)) as client:
            routed = client.post("/v1/route", json=make_body(request_id=9, tokens=200), headers=AUTH).json()
            answers[threshold] = client.post("/v1/score", json=make_body(tokens=200)).json()
            bad = client.post("/v1/score", json=make_body(tokens=3) | {"candidates": [{"worker_id": -1}]})
        assert (bad.status_code, bad.json()["detail"][0]["loc"]) == (422, ["body", "candidates", 0, "worker_id"])
        # no KV events: the routed prefix is held in approximate mode, found again by the same hashes
        assert answers[threshold]["candidates"][routed["worker_id"]]["reusable_blocks"] == 200 // 16
    for answer in answers.values():
        for candidate in answer["candidates"]:
            candidate.pop("directory_age_s")  # wall-clock time since the route
    assert answers[0] == answers[16 * 2**20]


def test_a_worker_that_dies_is_a_503_and_the_next_request_gets_a_new_pool(tmp_path):
    settings = ServiceSettings(db_path=tmp_path / "log.duckdb")

    async def scenario():
        pool = HeavyPool(settings)
        try:
            first, _ = await pool.rank(forest_body(10))
            running = asyncio.create_task(pool.rank(forest_body(50_000)))
            await asyncio.sleep(0.5)
            for pid in list(pool._executor._processes):
                os.kill(pid, signal.SIGKILL)
            with pytest.raises(PoolBusyError, match="a heavy-request worker process died; retry after 1 s"):
                await running
            again, _ = await pool.rank(forest_body(10))
            return first, again, pool.in_flight
        finally:
            pool.shutdown()

    assert asyncio.run(scenario()) == (200, 200, 0)
