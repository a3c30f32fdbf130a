"""``kvcost serve --kv-events``: a real vLLM-format publisher fills the service's directory, /v1/score sees it."""

import hashlib
import pickle
import re

import cbor2
import pytest
import xxhash
import zmq
from fastapi.testclient import TestClient

from kvcost.serving.api import create_app
from kvcost.serving.engines.kv_subscriber import KVEventSource
from kvcost.serving.settings import ServiceSettings, parse_kv_event_source
from tests.serving.engines.test_kv_events import VMAP
from tests.serving.engines.test_kv_subscriber import V010, FakeEngine, stored, wait_for

BLOCK = 4


@pytest.fixture
def context():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def score_body(namespace, hashes=(11, 12, 13)):
    return {
        "request": {"request_id": 1, "namespace": namespace, "block_hashes": list(hashes), "input_tokens": 14},
        "candidates": [{"worker_id": 0, "snapshot": {}}, {"worker_id": 1, "snapshot": {}}],
    }


def reuse_of(out):
    return [(c["worker_id"], c["reusable_tokens"], c["tier"]) for c in out["candidates"]]


@pytest.mark.parametrize(
    ("options", "namespace"),
    [
        ({}, {"model": "llama-3-8b"}),
        (
            {"served_model_name": "meta-llama/Meta-Llama-3-8B", "revision": "v2", "kv_layout": "fp8-tp1"},
            {"model": "meta-llama/Meta-Llama-3-8B", "revision": "v2", "kv_layout": "fp8-tp1"},
        ),
    ],
)
def test_published_blocks_become_reusable_prefixes(tmp_path, context, options, namespace):
    engine = FakeEngine(context)
    settings = ServiceSettings(
        db_path=tmp_path / "log.duckdb",
        segment_roll_interval_s=0,
        model="llama-3-8b",
        block_size_tokens=BLOCK,
        kv_events=[f"1={engine.endpoint}"],
        **options,
    )
    with TestClient(create_app(settings)) as client:
        subscriber = client.app.state.kv_subscriber
        engine.wait_subscribed()
        engine.publish(0, V010.EventBatch(100.0, [stored([11, 12])], None))
        wait_for(subscriber, 1)
        out = client.post("/v1/score", json=score_body({**namespace, "block_size_tokens": BLOCK})).json()
        other = client.post("/v1/score", json=score_body({"model": "other", "block_size_tokens": BLOCK})).json()
    engine.close()
    assert reuse_of(out) == [(0, 0, "none"), (1, 8, "gpu")]
    assert reuse_of(other) == [(0, 0, "none"), (1, 0, "none")]


@pytest.mark.parametrize(
    ("replay", "reusable_tokens", "stale"),
    [(True, 12, False), (False, 4, True)],  # the lost batch asked for again / the worker flagged stale
)
def test_a_lost_batch_is_replayed_or_flags_the_worker_stale(tmp_path, context, replay, reusable_tokens, stale):
    engine = FakeEngine(context, replay=replay)
    source = f"1={engine.endpoint}" + (f",{engine.replay_endpoint}" if replay else "")
    settings = ServiceSettings(
        db_path=tmp_path / "log.duckdb", segment_roll_interval_s=0, block_size_tokens=BLOCK, kv_events=[source]
    )
    with TestClient(create_app(settings)) as client:
        subscriber = client.app.state.kv_subscriber
        engine.wait_subscribed()
        engine.publish(0, V010.EventBatch(100.0, [stored([11])], None))
        engine.publish(1, V010.EventBatch(100.0, [stored([12], parent=11)], None), send=False)
        engine.publish(2, V010.EventBatch(100.0, [stored([13], parent=12)], None))
        if replay:
            assert engine.serve_one_replay() == 1
        wait_for(subscriber, 2)
        out = client.post("/v1/score", json=score_body({"model": "llama-3-8b", "block_size_tokens": BLOCK})).json()
    engine.close()
    assert reuse_of(out) == [(0, 0, "none"), (1, reusable_tokens, "gpu")]
    assert [c["directory_stale"] for c in out["candidates"]] == [False, stale]


def test_a_configured_stream_shows_in_metrics_before_its_first_message(tmp_path, context):
    engine = FakeEngine(context)
    settings = ServiceSettings(
        db_path=tmp_path / "log.duckdb", segment_roll_interval_s=0, kv_events=[f"3={engine.endpoint}"]
    )
    with TestClient(create_app(settings)) as client:
        text = client.get("/metrics").text
    engine.close()
    assert 'kvcost_directory_staleness_seconds{worker="3"} +Inf' in text
    assert 'kvcost_directory_stale{worker="3"} 0.0' in text


def test_kv_event_entries_are_validated():
    assert parse_kv_event_source("3=tcp://127.0.0.1:5557") == KVEventSource(3, "tcp://127.0.0.1:5557")
    assert parse_kv_event_source("3=tcp://h:5557,tcp://h:5558") == KVEventSource(
        3, "tcp://h:5557", replay_endpoint="tcp://h:5558"
    )
    assert parse_kv_event_source("0=ipc:///tmp/kv").endpoint == "ipc:///tmp/kv"
    for bad in (
        "x",
        "0=tcp://127.0.0.1",
        "0=tcp://",
        "0=tcp://h:0",
        "0=tcp://h:65536",
        "0=tcp://*:5557",
        "0=http://h:80",
        "0=tcp://h:1,tcp://h:2,tcp://h:3",
        "0=ipc://",
    ):
        with pytest.raises(ValueError, match=f"kv_events entry '{re.escape(bad)}', expected WORKER=tcp://HOST:PORT"):
            ServiceSettings(db_path="log.duckdb", kv_events=[bad])
    with pytest.raises(ValueError, match="gives one endpoint for both sockets"):
        ServiceSettings(db_path="log.duckdb", kv_events=["0=tcp://h:5557,tcp://h:5557"])
    with pytest.raises(ValueError, match="kv_layout = 'foo', expected '<dtype>-tp<N>'"):
        ServiceSettings(db_path="log.duckdb", kv_layout="foo")
    for field in ("served_model_name", "revision"):
        with pytest.raises(ValueError, match=field):
            ServiceSettings(db_path="log.duckdb", **{field: ""})
    with pytest.raises(ValueError, match=r"kv_events names worker ids \[0, 0\]; each worker may have one event"):
        ServiceSettings(db_path="log.duckdb", kv_events=["0=tcp://a:5557", "0=tcp://b:5557"])


# What a vLLM engine computes (vllm/v1/core/kv_cache_utils.py hash_block_tokens with the hash functions of
# vllm/utils/hashing.py), restated here independently of kvcost.routing.block_hash.
ENGINE_HASH_FN = {
    "sha256": lambda x: hashlib.sha256(pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)).digest(),
    "sha256_cbor": lambda x: hashlib.sha256(cbor2.dumps(x, canonical=True)).digest(),
    "xxhash": lambda x: xxhash.xxh3_128_digest(pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)),
    "xxhash_cbor": lambda x: xxhash.xxh3_128_digest(cbor2.dumps(x, canonical=True)),
}


def engine_block_hashes(tokens, block_size, algorithm, seed, lora=None, salt=None):
    """The ints a vLLM 0.32 engine publishes in BlockStored for ``tokens`` (PYTHONHASHSEED=seed): extra keys
    tagged, ``("lora", name, path)`` on every block and ``("cache_salt", salt)`` on the first."""
    fn = ENGINE_HASH_FN[algorithm]
    parent = fn(seed)  # NONE_HASH
    out = []
    for i in range(len(tokens) // block_size):
        keys = ([("lora", *lora)] if lora else []) + ([("cache_salt", salt)] if i == 0 and salt else [])
        parent = fn((parent, tuple(tokens[i * block_size : (i + 1) * block_size]), tuple(keys) if keys else None))
        out.append(int.from_bytes(parent, "big") & (2**64 - 1))
    return out


@pytest.mark.parametrize("algorithm", ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"])
def test_token_ids_match_the_blocks_an_engine_published(tmp_path, context, algorithm):
    tokens = [7, 300, 70_000, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18]  # 5 full blocks of 4
    engine = FakeEngine(context)
    settings = ServiceSettings(
        db_path=tmp_path / "log.duckdb",
        segment_roll_interval_s=0,
        block_size_tokens=BLOCK,
        hash_algorithm=algorithm,
        hash_seed="42",
        kv_events=[f"1={engine.endpoint}"],
        lora_modules=["sql-lora=/adapters/sql"],
    )
    plain = engine_block_hashes(tokens, BLOCK, algorithm, "42")
    tenant = engine_block_hashes(tokens, BLOCK, algorithm, "42", lora=("sql-lora", "/adapters/sql"), salt="tenant-1")
    with TestClient(create_app(settings)) as client:
        subscriber = client.app.state.kv_subscriber
        engine.wait_subscribed()
        events = [VMAP.BlockStored(plain[:3], None, tokens[:12], BLOCK, None, "GPU", None)]
        events.append(VMAP.BlockStored(tenant[:2], None, tokens[:8], BLOCK, 1, "GPU", "sql-lora"))
        engine.publish(0, VMAP.EventBatch(100.0, events))
        wait_for(subscriber, 1)

        def reusable(adapter="", cache_salt=""):
            namespace = {"model": "llama-3-8b", "block_size_tokens": BLOCK, "adapter": adapter}
            request = {"request_id": 1, "namespace": namespace | {"cache_salt": cache_salt}, "token_ids": tokens}
            body = {"request": request, "candidates": [{"worker_id": 0, "snapshot": {}}, {"worker_id": 1}]}
            client.post("/v1/workers/1/snapshot", json={})
            return [c["reusable_tokens"] for c in client.post("/v1/score", json=body).json()["candidates"]]

        assert reusable() == [0, 12]
        assert reusable("sql-lora", "tenant-1") == [0, 8]
        assert reusable("sql-lora", "tenant-2") == [0, 0]  # another tenant's salt: another chain
        assert reusable("", "tenant-1") == [0, 0]
    engine.close()


def test_kv_event_counters_per_worker_in_the_prometheus_exposition(tmp_path, context):
    engine = FakeEngine(context)
    settings = ServiceSettings(
        db_path=tmp_path / "log.duckdb",
        segment_roll_interval_s=0,
        block_size_tokens=BLOCK,
        kv_events=[f"3={engine.endpoint}"],
    )
    with TestClient(create_app(settings)) as client:
        subscriber = client.app.state.kv_subscriber
        engine.wait_subscribed()
        engine.publish(0, V010.EventBatch(100.0, [stored([11, 12]), V010.BlockRemoved([12], "GPU")], None))
        engine.publish(2, V010.EventBatch(101.0, [stored([21], medium="TAPE")], None))  # gap (1 lost), bad medium
        engine.send_raw([engine.topic, (3).to_bytes(8, "big"), b"\xc1 not msgpack"])
        engine.publish(1, V010.EventBatch(102.0, [stored([31])], None))  # went back: a restart
        wait_for(subscriber, 4)
        text = client.get("/metrics").text
    engine.close()
    expected = [
        'kvcost_kv_event_messages_total{worker="3"} 4.0',
        'kvcost_kv_event_batches_total{source="live",worker="3"} 3.0',
        'kvcost_kv_event_batches_total{source="replay",worker="3"} 0.0',
        'kvcost_kv_events_ingested_total{worker="3"} 3.0',
        'kvcost_kv_blocks_total{op="stored",worker="3"} 3.0',
        'kvcost_kv_blocks_total{op="removed",worker="3"} 1.0',
        'kvcost_kv_events_rejected_total{scope="message",worker="3"} 1.0',
        'kvcost_kv_events_rejected_total{scope="event",worker="3"} 1.0',
        'kvcost_kv_event_gaps_total{worker="3"} 1.0',
        'kvcost_kv_event_replays_requested_total{worker="3"} 0.0',
        'kvcost_kv_engine_restarts_total{worker="3"} 1.0',
        "kvcost_kv_event_unknown_topic_total 0.0",
        "kvcost_directory_blocks 1.0",  # the restart dropped 11; 31 stored after it
        'kvcost_directory_stale{worker="3"} 0.0',  # the restart's clear made the view exact again
    ]
    lines = set(text.splitlines())
    assert [line for line in expected if line not in lines] == []
    assert any(line.startswith('kvcost_directory_staleness_seconds{worker="3"} ') for line in lines)
