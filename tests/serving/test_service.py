"""Tests of kvcost.serving.service (settings, decision store, recovery, racing observations) and metrics."""

import duckdb
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from kvcost.core.types import Namespace
from kvcost.routing.policies import ROUTER_POLICIES
from kvcost.routing.policies.basic import LeastLoadedPolicy
from kvcost.serving.api import create_app
from kvcost.serving.metrics import ServiceMetrics, reason_kind
from kvcost.serving.settings import ServiceSettings, is_loopback
from tests.serving.test_api import AUTH, make_body, settings_for


def test_settings_name_the_hash_algorithm():
    assert ServiceSettings(db_path="log.duckdb").hash_algorithm == "sha256"
    with pytest.raises(ValidationError, match="hash_algorithm = 'md5', expected one of sha256, sha256_cbor, xxhash"):
        ServiceSettings(db_path="log.duckdb", hash_algorithm="md5")


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.8.0.1", True), ("::1", True), ("localhost", True), ("0.0.0.0", False)]
    + [("10.0.0.5", False), ("::", False), ("example.com", False)],
)
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_settings_refuse_open_non_loopback_and_bad_names(tmp_path):
    db = tmp_path / "log.duckdb"
    with pytest.raises(ValidationError, match="host = '0.0.0.0' is not a loopback address and no token file"):
        ServiceSettings(db_path=db, host="0.0.0.0")
    assert ServiceSettings(db_path=db, host="0.0.0.0", insecure=True).insecure
    assert ServiceSettings(db_path=db, host="0.0.0.0", token_file=tmp_path / "t").token_file
    with pytest.raises(ValidationError, match="policy = 'oracle', expected one of"):
        ServiceSettings(db_path=db, policy="oracle")
    with pytest.raises(ValidationError, match="gpu_default = 'tpu'"):
        ServiceSettings(db_path=db, gpu_default="tpu")
    with pytest.raises(ValidationError, match="model = 'gpt'"):
        ServiceSettings(db_path=db, model="gpt")


def test_settings_refuse_a_replay_only_policy_because_of_its_flag(monkeypatch, tmp_path):
    db = tmp_path / "log.duckdb"
    usable = [n for n in ROUTER_POLICIES.names() if n != "oracle"]
    with pytest.raises(ValidationError) as err:
        ServiceSettings(db_path=db, policy="oracle")
    assert err.value.errors()[0]["ctx"]["error"].args == (
        f"policy = 'oracle', expected one of {', '.join(usable)} (replay-only: it needs the simulator's truth)",
    )
    with pytest.raises(ValidationError) as err:
        ServiceSettings(db_path=db, policy="nope")
    assert err.value.errors()[0]["ctx"]["error"].args == (f"policy = 'nope', expected one of {', '.join(usable)}",)
    assert ServiceSettings(db_path=db, policy="least_loaded").policy == "least_loaded"
    monkeypatch.setattr(LeastLoadedPolicy, "replay_only", True)  # the flag, not the name, decides
    with pytest.raises(ValidationError, match="policy = 'least_loaded', expected one of aibrix_prefix_cache, cost_aw"):
        ServiceSettings(db_path=db, policy="least_loaded")


def test_decision_store_is_a_bounded_lru(tmp_path):
    with TestClient(create_app(settings_for(tmp_path, max_decisions=3))) as client:
        for request_id in range(5):
            assert client.post("/v1/route", json=make_body(request_id=request_id), headers=AUTH).status_code == 200
        assert client.app.state.service.decisions_in_memory() == 3
        for request_id, status in ((0, "unjoined"), (1, "unjoined"), (2, "recorded"), (4, "recorded")):
            observed = client.post("/v1/observe", json={"request_id": request_id, "ttft_s": 0.1}, headers=AUTH)
            assert observed.json()["status"] == status, request_id


def test_restart_reloads_decisions_from_the_log(tmp_path):
    settings = settings_for(tmp_path)
    with TestClient(create_app(settings)) as client:
        first_run = client.post("/v1/route", json=make_body(request_id=1), headers=AUTH).json()["run_id"]
        client.post("/v1/route", json=make_body(request_id=2), headers=AUTH)
        client.post("/v1/observe", json={"request_id": 1, "ttft_s": 0.1}, headers=AUTH)
        client.post("/v1/observe", json={"request_id": 77, "ttft_s": 0.3}, headers=AUTH)  # no decision: unjoined
    with TestClient(create_app(settings)) as client:
        assert client.app.state.service.run_id != first_run
        unjoined = client.post("/v1/observe", json={"request_id": 77, "ttft_s": 0.3}, headers=AUTH).json()
        assert (unjoined["status"], unjoined["worker_id"]) == ("duplicate", None)
        again = client.post("/v1/observe", json={"request_id": 1, "ttft_s": 0.1}, headers=AUTH).json()
        assert (again["status"], again["run_id"]) == ("duplicate", first_run)
        late = client.post("/v1/observe", json={"request_id": 2, "ttft_s": 0.2}, headers=AUTH).json()
        assert (late["status"], late["run_id"], late["worker_id"]) == ("recorded", first_run, 1)
        assert client.post("/v1/route", json=make_body(request_id=2), headers=AUTH).status_code == 409
    with duckdb.connect(str(settings.db_path), read_only=True) as con:
        got = con.execute("SELECT run_id, request_id, arrival_s, actual_ttft_s FROM requests ORDER BY 2").fetchall()
        runs = con.execute("SELECT count(*) FROM runs WHERE configuration = 'serve'").fetchall()
    assert [(g[0], g[1], g[3]) for g in got] == [(first_run, 1, 0.1), (first_run, 2, 0.2)]
    assert got[0][2] is not None and got[1][2] is None  # candidates do not store the arrival of a reloaded decision
    assert runs == [(2,)]


def test_reason_kind_is_low_cardinality():
    assert reason_kind("least outstanding work 1234 tokens") == "least outstanding work"
    assert reason_kind("round robin") == "round robin"
    assert reason_kind("cache hit: 0.8 > 0.3 → best-match worker 2") == "cache hit"
    assert (
        reason_kind("no prefix match → least-request worker 3 (4 running)") == "no prefix match → least-request worker"
    )
    assert reason_kind("7 ms") == "other"
    metrics = ServiceMetrics()
    for i in range(100):
        metrics.count_decision("p", f"kind{chr(65 + i % 26)}{chr(65 + i // 26)} x")
    kinds = {s.labels["reason_kind"] for m in metrics.decisions.collect() for s in m.samples}
    assert len(kinds) == 65 and "other" in kinds


@pytest.mark.slow
def test_real_empty_mlflow_registry_degrades_to_analytic(tmp_path):
    from tests.serving.test_api import wait_ready

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with TestClient(create_app(settings_for(tmp_path, mlflow_uri=uri))) as client:
        degraded = wait_ready(client, "degraded", attempts=3000)
        assert degraded["reason"].startswith("champion not loaded (LookupError: no kvcost-terms version with alias")
        assert degraded["model"] == "analytic"
        models = client.get("/v1/cost-models").json()
        assert (models["registry_uri"], models["registry_error"], models["versions"]) == (uri, None, [])
        assert client.post("/v1/score", json=make_body()).json()["model"] == "analytic"


def test_racing_observations_of_one_id_record_one_row(tmp_path):
    import asyncio

    from kvcost.serving.schemas import ObservationIn, ScoreRequestIn
    from kvcost.serving.service import ScoringService

    settings = settings_for(tmp_path, token=False)
    service = ScoringService(settings)
    service.start()
    try:
        service.route(ScoreRequestIn.model_validate(make_body(request_id=8)))
        observation = ObservationIn(request_id=8, ttft_s=0.3)

        async def race():
            return await asyncio.gather(*(service.observe(observation) for _ in range(5)))

        statuses = sorted(r.status for r in asyncio.run(race()))
    finally:
        service.stop()
    assert statuses == ["duplicate"] * 4 + ["recorded"]
    with duckdb.connect(str(settings.db_path), read_only=True) as con:
        assert con.execute("SELECT request_id, actual_ttft_s FROM requests").fetchall() == [(8, 0.3)]


def test_capped_blocks_reach_the_metrics(tmp_path):
    with pytest.raises(ValidationError, match="max_directory_blocks_per_worker"):
        settings_for(tmp_path, max_directory_blocks_per_worker=0)
    with TestClient(create_app(settings_for(tmp_path, max_directory_blocks_per_worker=2))) as client:
        service = client.app.state.service
        service.directory.apply_stored(Namespace("m"), 0, [1, 2, 3], parent_hash=None, tier="gpu", now_s=1.0)
        assert client.post("/v1/workers/0/snapshot", json={}, headers=AUTH).status_code == 200
        text = client.get("/metrics").text
    assert 'kvcost_directory_capped_blocks_total{worker="0"} 1.0' in text
    assert 'kvcost_directory_blocks_held{worker="0"} 2.0' in text
    assert "kvcost_in_flight_capped_entries_total 0.0" in text


def test_a_model_the_fleet_does_not_serve_is_priced_as_an_explicit_fallback(tmp_path):
    with TestClient(create_app(settings_for(tmp_path, served_model_name="tiny"))) as client:
        profiles = {}
        for model in ("tiny", "llama-3-8b", "qwen2.5-72b"):
            body = make_body()
            body["request"]["namespace"]["model"] = model
            profiles[model] = client.post("/v1/score", json=body).json()["profile"]
        text = client.get("/metrics").text
    assert profiles == {"tiny": "llama-3-8b", "llama-3-8b": "llama-3-8b", "qwen2.5-72b": "fallback:llama-3-8b"}
    assert 'kvcost_profile_fallbacks_total{endpoint="score"} 1.0' in text


def test_the_gateways_finished_requests_reach_the_routers_output_lengths(tmp_path):
    from kvcost.serving.outcomes import MeasuredOutcome
    from kvcost.serving.schemas import ScoreRequestIn
    from kvcost.serving.service import ScoringService

    service = ScoringService(settings_for(tmp_path, token=False))
    service.start()
    try:
        for request_id, e2e_s in ((21, None), (22, 1.5)):  # 21 never finished: its length is not known
            service.route(ScoreRequestIn.model_validate(make_body(request_id=request_id)))
            measured = MeasuredOutcome(request_id, 0.2, None, e2e_s, None, 30, None, 0, None, "ok")
            service.record_measured(measured).result(timeout=10)
        lengths = service.routing.router.decode_lengths
    finally:
        service.stop()
    # one 30-token completion after the prior (mean 172.5, weight 100, window 1000 completions)
    assert (lengths.observed, lengths.mean_tokens) == (1, pytest.approx((0.999 * 17250 + 30) / 100.9, rel=1e-12))


@pytest.mark.parametrize("max_decisions", [10, 1])  # 1: request 31's decision is forgotten when 32 is routed
def test_a_gateway_request_that_failed_before_its_first_token_leaves_the_in_flight_index_at_once(
    tmp_path, max_decisions
):
    from kvcost.serving.outcomes import MeasuredOutcome
    from kvcost.serving.schemas import ScoreRequestIn
    from kvcost.serving.service import ScoringService

    service = ScoringService(settings_for(tmp_path, token=False, max_decisions=max_decisions))
    service.start()
    try:
        service.route(ScoreRequestIn.model_validate(make_body(request_id=31)))
        service.route(ScoreRequestIn.model_validate(make_body(request_id=32, tokens=40)))
        held = len(service.routing.router.in_flight)
        failed = MeasuredOutcome(31, None, None, None, None, None, None, 0, None, "engine 1 failed: first token")
        service.record_measured(failed)
        left = len(service.routing.router.in_flight)
    finally:
        service.stop()
    assert (held, left) == (2, 1)  # request 31's entry is not kept for in_flight_min_ttl_s (10 s); 32's is
