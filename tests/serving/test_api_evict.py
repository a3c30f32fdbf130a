"""``POST /v1/evict/rank``: eviction order with value terms, leaf rule, and 422s naming the field."""

import pytest
from fastapi.testclient import TestClient

from kvcost.serving.api import create_app
from kvcost.serving.settings import ServiceSettings


@pytest.fixture
def client(tmp_path):
    settings = ServiceSettings(db_path=tmp_path / "log.duckdb", segment_roll_interval_s=0)
    with TestClient(create_app(settings)) as c:
        yield c


def node(node_id, depth, last_access_s, prefill_saved_s=0.5, parent_id=None, **extra):
    return {
        "node_id": node_id,
        "parent_id": parent_id,
        "depth_blocks": depth,
        "last_access_s": last_access_s,
        "created_s": 0.0,
        "size_bytes": 2.0,
        "prefill_saved_s": prefill_saved_s,
        **extra,
    }


def test_cost_aware_order_and_value_terms(client):
    body = {
        "policy": "cost_aware",
        "now_s": 100.0,
        "horizon_s": 100.0,
        "nodes": [
            node(10, 0, 100.0, 0.4),  # p = 1,   lost 0.4  → value 0.2
            node(11, 1, 100.0, 0.8, parent_id=10, restore_s=0.1),  # p = 1, lost min(0.8, 0.1) → 0.05
            node(12, 0, 0.0, 0.4),  # p = e^-1, lost 0.4 → 0.0736
        ],
    }
    answer = client.post("/v1/evict/rank", json=body)
    assert answer.status_code == 200, answer.text
    out = answer.json()
    assert [n["node_id"] for n in out["nodes"]] == [11, 12, 10]  # 11 is a leaf; its parent 10 goes after it
    first = out["nodes"][0]
    assert first == {
        "node_id": 11,
        "p_reuse": 1.0,
        "prefill_saved_s": 0.8,
        "size_bytes": 2.0,
        "restore_s": 0.1,
        "value": pytest.approx(0.05),
    }
    assert out["nodes"][1]["value"] == pytest.approx(0.4 * 0.36787944117144233 / 2)
    assert out["nodes"][2]["restore_s"] is None


def test_lru_ignores_the_tree_and_reports_no_p_reuse(client):
    body = {"policy": "lru", "now_s": 5.0, "nodes": [node(1, 0, 1.0), node(2, 1, 3.0, parent_id=1)]}
    out = client.post("/v1/evict/rank", json=body).json()
    assert [n["node_id"] for n in out["nodes"]] == [1, 2]
    assert out["nodes"][0]["p_reuse"] is None
    assert (out["horizon_s"], out["reuse_model"]) == (None, None)  # cost_aware's P(reuse) does not apply


def test_unknown_policy_is_a_422_naming_the_field(client):
    answer = client.post("/v1/evict/rank", json={"policy": "fifo", "now_s": 0.0, "nodes": []})
    assert answer.status_code == 422
    assert answer.json()["detail"][0]["loc"] == ["body", "policy"]
    message = answer.json()["message"]
    assert message.startswith("policy: unknown eviction policy 'fifo', expected one of")
    assert "Value error" not in message and "got 'fifo'" not in message  # the value is named once
    offline = client.post("/v1/evict/rank", json={"policy": "clairvoyant", "now_s": 0.0, "nodes": []})
    assert offline.status_code == 422  # the offline reference reads a trace's future: never served
    assert offline.json()["message"].startswith(
        "policy: 'clairvoyant' is an offline reference that reads a trace's future (replays only), "
        "expected one of cost_aware, flop_aware"
    )


def test_bad_node_fields_are_422s_naming_the_field(client):
    for size_bytes in (0, 0.5):  # below one byte: a unit error, and values would overflow
        bad_size = {"policy": "lhd", "now_s": 0.0, "nodes": [node(1, 0, 0.0, size_bytes=size_bytes)]}
        answer = client.post("/v1/evict/rank", json=bad_size)
        assert answer.status_code == 422
        assert answer.json()["detail"][0]["loc"] == ["body", "nodes", 0, "size_bytes"]

    orphan = {"policy": "gdsf", "now_s": 0.0, "nodes": [node(1, 0, 0.0), node(2, 1, 0.0, parent_id=7)]}
    answer = client.post("/v1/evict/rank", json=orphan)
    assert answer.status_code == 422
    assert answer.json()["detail"][0]["loc"] == ["body", "nodes", 1, "parent_id"]
    assert answer.json()["message"].startswith("nodes.1.parent_id: parent_id 7 must be a node_id of this list")

    unknown = {"policy": "lru", "now_s": 0.0, "nodes": [node(1, 0, 0.0, colour="red")]}
    assert client.post("/v1/evict/rank", json=unknown).json()["detail"][0]["loc"] == ["body", "nodes", 0, "colour"]


def test_a_served_cure_model_gives_cost_aware_its_p_reuse_and_h(tmp_path):
    import math

    from kvcost.models.reuse_cure import CureReuseModel

    # class 0 (first turns) never reused; class 3 (reused share ≥ 0.8): π 0.5, median gap 100 s, σ 1
    CureReuseModel(100.0, [(0.0, 1.0, 1.0)] * 3 + [(0.5, math.log(100.0), 1.0)]).save(tmp_path / "reuse")
    settings = ServiceSettings(
        db_path=tmp_path / "log.duckdb", segment_roll_interval_s=0, reuse_model_dir=tmp_path / "reuse"
    )
    body = {
        "policy": "cost_aware",
        "now_s": 100.0,
        "horizon_s": 7.0,  # the model's own H (100 s) is used
        "nodes": [
            node(1, 0, 100.0, request_blocks=10, request_reused_blocks=9),  # idle 0: P = 0.5 · F(100) = 0.25
            node(2, 0, 0.0, request_blocks=10, request_reused_blocks=9),  # idle 100 s: P = 0.170594
            node(3, 0, 100.0, request_blocks=10),  # a first turn: P = 0
        ],
    }
    with TestClient(create_app(settings)) as client:
        out = client.post("/v1/evict/rank", json=body).json()
    assert (out["horizon_s"], out["reuse_model"]) == (100.0, "CureReuseModel")
    assert [(n["node_id"], round(n["p_reuse"], 6)) for n in out["nodes"]] == [(3, 0.0), (2, 0.170594), (1, 0.25)]


def test_a_missing_reuse_model_fails_at_start_naming_the_setting(tmp_path):
    with pytest.raises(ValueError, match="reuse_model_dir = '.*nothing' is not a folder"):
        ServiceSettings(db_path=tmp_path / "log.duckdb", reuse_model_dir=tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    settings = ServiceSettings(db_path=tmp_path / "log.duckdb", reuse_model_dir=tmp_path / "empty")
    with pytest.raises(ValueError, match="reuse_model_dir = '.*empty': .* neither manifest.json nor cure.json"):
        create_app(settings)


def test_serve_cli_refuses_a_missing_reuse_model_with_exit_2(tmp_path):
    from typer.testing import CliRunner

    from kvcost.cli import app

    args = ["serve", "--db", str(tmp_path / "log.duckdb"), "--reuse-model-dir", str(tmp_path / "none")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "--reuse-model-dir = " in result.output and "none' is not a folder" in result.output
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(app, [*args[:-1], str(tmp_path / "empty")])
    assert result.exit_code == 2
    assert "neither manifest.json nor cure.json" in result.output


def test_nodes_from_the_future_or_reusing_more_than_they_hold_are_refused(client):
    late = {"policy": "cost_aware", "now_s": 5.0, "nodes": [node(1, 0, 9.0)]}
    answer = client.post("/v1/evict/rank", json=late)
    assert answer.status_code == 422
    assert answer.json()["message"] == "nodes.0.last_access_s: last_access_s 9.0 is after now_s 5.0"
    greedy = {
        "policy": "cost_aware",
        "now_s": 5.0,
        "nodes": [node(1, 1, 1.0, request_blocks=2, request_reused_blocks=7)],
    }
    answer = client.post("/v1/evict/rank", json=greedy)
    assert answer.status_code == 422
    assert answer.json()["message"] == "nodes.0.request_reused_blocks: request_reused_blocks 7 exceeds request_blocks 2"
