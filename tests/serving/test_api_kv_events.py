"""``kvcost serve --kv-events``: a real vLLM-format publisher fills the service's directory, /v1/score sees it."""

import pytest
import zmq
from fastapi.testclient import TestClient

from kvcost.serving.api import create_app
from kvcost.serving.service import ServiceSettings, parse_kv_event_source

from .test_kv_subscriber import V010, FakeEngine, stored, wait_for

BLOCK = 4


@pytest.fixture
def context():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def test_published_blocks_become_reusable_prefixes(tmp_path, context):
    engine = FakeEngine(context)
    settings = ServiceSettings(
        db_path=tmp_path / "log.duckdb",
        segment_roll_interval_s=0,
        model="llama-3-8b",
        block_size_tokens=BLOCK,
        kv_events=[f"1={engine.endpoint}"],
    )
    with TestClient(create_app(settings)) as client:
        subscriber = client.app.state.kv_subscriber
        engine.wait_subscribed()
        engine.publish(0, V010.EventBatch(100.0, [stored([11, 12])], None))
        wait_for(subscriber, 1)
        body = {
            "request": {
                "request_id": 1,
                "namespace": {"model": "llama-3-8b", "block_size_tokens": BLOCK},
                "block_hashes": [11, 12, 13],
                "input_tokens": 14,
            },
            "candidates": [{"worker_id": 0, "snapshot": {}}, {"worker_id": 1, "snapshot": {}}],
        }
        out = client.post("/v1/score", json=body).json()
    engine.close()
    assert [(c["worker_id"], c["reusable_tokens"], c["tier"]) for c in out["candidates"]] == [
        (0, 0, "none"),
        (1, 8, "gpu"),
    ]


def test_kv_event_entries_are_validated():
    assert parse_kv_event_source("3=tcp://127.0.0.1:5557") == (3, "tcp://127.0.0.1:5557")
    with pytest.raises(ValueError, match="kv_events entry 'x', expected WORKER=tcp://HOST:PORT"):
        ServiceSettings(db_path="log.duckdb", kv_events=["x"])
