"""HTTP tests of kvcost.serving.api with FastAPI's TestClient: every endpoint and every error path.

The service runs for real: a DuckDB log in ``tmp_path``, the bundled A100/H100
profiles of Llama-3-8B, the embedded router. Expected numbers come from the
same embedded :class:`Router` called in-process on the same inputs.
"""

import json
import threading

import duckdb
import numpy as np
import pytest
from fastapi.testclient import TestClient

from kvcost.calibration.conformal import SplitConformal
from kvcost.core.composition import TERMS
from kvcost.core.hardware import MODELS
from kvcost.core.links import CPU_TO_GPU
from kvcost.core.types import Namespace, RouteRequest, WorkerSnapshot
from kvcost.features.spec import FEATURE_INDEX, FEATURE_NAMES
from kvcost.models.predictors import make_term_predictor
from kvcost.models.term_set import TermModelSet
from kvcost.routing.block_hash import block_hashes_for
from kvcost.routing.directory import CacheDirectory
from kvcost.routing.router import Router, RouterSettings
from kvcost.serving.api import create_app
from kvcost.serving.schemas import MAX_CANDIDATES, MAX_TOKENS
from kvcost.serving.service import ScoringService
from kvcost.serving.settings import ServiceSettings

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BLOCK = 16


def make_body(request_id=1, tokens=100, candidates=None, **request_fields):
    """A score/route body: ``tokens`` token ids 0..tokens-1 in namespace ``m`` (16-token blocks)."""
    request = {"request_id": request_id, "namespace": {"model": "m", "block_size_tokens": BLOCK}}
    request["token_ids"] = list(range(tokens))
    request.update(request_fields)
    if candidates is None:
        candidates = [
            {"worker_id": 0, "snapshot": {"waiting_prefill": [[4000, 0]], "running_requests": 2}},
            {"worker_id": 1, "snapshot": {}},
        ]
    return {"request": request, "candidates": candidates}


def settings_for(tmp_path, token=True, **overrides):
    fields = dict(db_path=tmp_path / "log.duckdb", segment_roll_interval_s=0)
    if token:
        (tmp_path / "token").write_text(TOKEN + "\n")
        fields["token_file"] = tmp_path / "token"
    return ServiceSettings(**(fields | overrides))


@pytest.fixture
def client(tmp_path):
    with TestClient(create_app(settings_for(tmp_path))) as c:
        yield c


def rows(db, sql):
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql).fetchall()


def test_score_equals_embedded_router_and_has_no_routing_side_effects(client):
    first = client.post("/v1/score", json=make_body())
    assert first.status_code == 200
    assert client.post("/v1/score", json=make_body()).json() == first.json()
    service = client.app.state.service
    assert len(service.router._window) == 0 and service.decisions_in_memory() == 0

    ns = Namespace("m", block_size_tokens=BLOCK)
    hashes = block_hashes_for(list(range(100)), BLOCK, ns)
    snaps = [
        WorkerSnapshot(0, "a100", ((4000, 0),), 2, 0, 0.0, 0, 0.0, 0.0),
        WorkerSnapshot(1, "a100", (), 0, 0, 0.0, 0, 0.0, 0.0),
    ]
    expected = Router(CacheDirectory(), service.step_models, RouterSettings()).route(
        RouteRequest(1, 0.0, 100, hashes, ns), snaps, 0.0
    )
    out = first.json()
    assert (out["request_blocks"], out["model"], out["learned"]) == (6, "analytic", False)
    for i, cand in enumerate(out["candidates"]):
        assert cand["worker_id"] == i
        assert [cand["terms"][f"{t}_s"] for t in TERMS] == expected.predictions.as_matrix()[i, :5].tolist()
        assert cand["ttft_s"] == cand["p50_s"] == cand["score_s"] == expected.predictions.ttft_s[i]
        assert cand["p90_s"] is None and cand["directory_age_s"] is None
        assert (cand["reusable_tokens"], cand["tier"], cand["snapshot"], cand["snapshot_age_s"]) == (
            0,
            "none",
            "inline",
            0.0,
        )


def test_route_records_decision_in_memory_and_in_candidates(client, tmp_path):
    response = client.post("/v1/route", json=make_body(request_id=7), headers=AUTH)
    assert response.status_code == 200
    out = response.json()
    # worker 0 has 4000 queued tokens: the idle worker 1 is faster
    assert (out["worker_id"], out["chosen_index"], out["policy"]) == (1, 1, "learned_cost_aware")
    assert out["reason"].startswith("min predicted TTFT")
    run_id = out["run_id"]
    assert run_id.startswith("serve-")
    metrics = client.get("/metrics").text
    assert 'kvcost_decisions_total{policy="learned_cost_aware",reason_kind="min predicted ttft"} 1.0' in metrics
    assert 'kvcost_route_latency_seconds_count{endpoint="route"} 1.0' in metrics
    client.__exit__(None, None, None)  # stop the service: it holds the log's write lock

    got = rows(
        tmp_path / "log.duckdb",
        "SELECT run_id, request_id, worker_id, chosen, input_tokens, request_blocks, queued_prefill_tokens, "
        "pred_ttft_s FROM candidates ORDER BY worker_id",
    )
    assert [g[:7] for g in got] == [(run_id, 7, 0, False, 100, 6, 4000), (run_id, 7, 1, True, 100, 6, 0)]
    assert [g[7] for g in got] == [c["ttft_s"] for c in out["candidates"]]
    assert rows(tmp_path / "log.duckdb", "SELECT configuration, trace FROM runs") == [("serve", "live")]


def test_observe_joins_its_decision_and_is_idempotent(client, tmp_path):
    routed = client.post("/v1/route", json=make_body(request_id=3), headers=AUTH).json()
    chosen = routed["candidates"][routed["chosen_index"]]
    observation = {
        "request_id": 3,
        "ttft_s": 0.05,
        "queue_s": 0.001,
        "prefill_s": 0.04,
        "actual_reuse_tokens": 0,
        "output_tokens": 12,
    }
    first = client.post("/v1/observe", json=observation, headers=AUTH)
    assert first.status_code == 200
    assert first.json() == {"request_id": 3, "status": "recorded", "run_id": routed["run_id"], "worker_id": 1}
    again = client.post("/v1/observe", json=observation | {"ttft_s": 9.0}, headers=AUTH)
    assert again.status_code == 200 and again.json()["status"] == "duplicate"
    metrics = client.get("/metrics").text
    assert 'kvcost_observations_total{result="recorded"} 1.0' in metrics
    assert 'kvcost_observations_total{result="duplicate"} 1.0' in metrics
    assert 'kvcost_prediction_abs_error_seconds_count{term="ttft"} 1.0' in metrics
    assert 'kvcost_prediction_abs_error_seconds_count{term="lookup"} 0.0' in metrics  # not observed
    client.__exit__(None, None, None)

    got = rows(
        tmp_path / "log.duckdb",
        "SELECT request_id, worker_id, input_tokens, output_tokens, predicted_reuse_tokens, actual_reuse_tokens, "
        "directory_mismatch_tokens, pred_queue_s, pred_ttft_s, actual_queue_s, actual_lookup_s, actual_ttft_s "
        "FROM requests",
    )
    assert got == [(3, 1, 100, 12, 0, 0, 0, chosen["terms"]["queue_s"], chosen["ttft_s"], 0.001, None, 0.05)]
    joined = rows(
        tmp_path / "log.duckdb",
        "SELECT count(*) FROM candidates c JOIN requests r USING (run_id, request_id) WHERE c.chosen",
    )
    assert joined == [(1,)]


def test_an_observation_without_a_decision_is_recorded_unjoined_once(client, tmp_path):
    body = {"request_id": 99, "ttft_s": 0.1, "queue_s": 0.02, "output_tokens": 7, "e2e_s": 0.4}
    first = client.post("/v1/observe", json=body, headers=AUTH)
    run_id = client.app.state.service.run_id
    assert first.status_code == 200
    assert first.json() == {"request_id": 99, "status": "unjoined", "run_id": run_id, "worker_id": None}
    again = client.post("/v1/observe", json={**body, "ttft_s": 9.0}, headers=AUTH).json()
    assert again["status"] == "duplicate"
    metrics = client.get("/metrics").text
    assert 'kvcost_observations_total{result="unjoined"} 1.0' in metrics
    assert 'kvcost_observations_total{result="duplicate"} 1.0' in metrics
    client.__exit__(None, None, None)

    got = rows(
        tmp_path / "log.duckdb",
        "SELECT run_id, request_id, actual_queue_s, actual_prefill_s, actual_ttft_s, output_tokens, e2e_s "
        "FROM unjoined_observations",
    )
    assert got == [(run_id, 99, 0.02, None, 0.1, 7, 0.4)]
    assert rows(tmp_path / "log.duckdb", "SELECT count(*) FROM requests") == [(0,)]


def test_routing_the_same_request_id_twice_is_409(client):
    assert client.post("/v1/route", json=make_body(request_id=5), headers=AUTH).status_code == 200
    response = client.post("/v1/route", json=make_body(request_id=5), headers=AUTH)
    assert response.status_code == 409
    assert "request_id 5 was already routed (to worker 1" in response.json()["detail"]


def test_pushed_snapshot_serves_candidates_without_one(client):
    missing = client.post("/v1/score", json=make_body(candidates=[{"worker_id": 4}]))
    assert missing.status_code == 422
    assert missing.json()["detail"][0]["loc"] == ["body", "candidates", 0, "snapshot"]
    assert "worker 4 has no snapshot" in missing.json()["message"]

    pushed = {"gpu": "h100", "running_requests": 3, "running_output_tokens": [7, 0, 12]}
    ack = client.post("/v1/workers/4/snapshot", json=pushed, headers=AUTH)
    assert ack.status_code == 200 and ack.json()["worker_id"] == 4
    assert client.app.state.service.routing.snapshots[4][0].running_output_tokens == (7, 0, 12)
    scored = client.post("/v1/score", json=make_body(candidates=[{"worker_id": 4}, {"worker_id": 5, "snapshot": {}}]))
    assert scored.status_code == 200
    first = scored.json()["candidates"][0]
    assert first["snapshot"] == "pushed" and first["snapshot_age_s"] >= 0
    metrics = client.get("/metrics").text
    assert 'kvcost_snapshot_age_seconds{worker="4"}' in metrics
    assert 'kvcost_directory_staleness_seconds{worker="4"} +Inf' in metrics  # no KV event yet
    assert "kvcost_directory_blocks 0.0" in metrics


def test_directory_hit_is_reported_per_candidate(client):
    service = client.app.state.service
    ns = Namespace("m", block_size_tokens=BLOCK)
    hashes = block_hashes_for(list(range(100)), BLOCK, ns)
    with service.lock:
        service.directory.apply_stored(ns, 1, hashes[:4], None, "cpu", service.clock() - 2.0)
    out = client.post("/v1/score", json=make_body()).json()["candidates"]
    assert [(c["reusable_blocks"], c["reusable_tokens"], c["tier"]) for c in out] == [(0, 0, "none"), (4, 64, "cpu")]
    assert out[1]["directory_age_s"] >= 2.0


def _with(body, path, value):
    body = json.loads(json.dumps(body))
    target = body
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return body


@pytest.mark.parametrize(
    ("path", "value", "loc", "text"),
    [
        (("candidates",), [{"worker_id": i, "snapshot": {}} for i in range(MAX_CANDIDATES + 1)], ["candidates"], "256"),
        (("candidates",), [], ["candidates"], "at least 1"),
        (("request", "input_tokens"), MAX_TOKENS + 1, ["request", "input_tokens"], "1048576"),
        (("request", "request_id"), -1, ["request", "request_id"], "greater than or equal to 0"),
        (("request", "request_id"), 1.5, ["request", "request_id"], "valid integer"),
        (("request", "token_ids"), [1, -2], ["request", "token_ids", 1], "greater than or equal to 0"),
        (("candidates", 0, "snapshot", "kv_usage"), 1.5, ["candidates", 0, "snapshot", "kv_usage"], "less than"),
        (("candidates", 0, "snapshot", "recent_step_s"), -0.1, ["candidates", 0, "snapshot", "recent_step_s"], "0"),
        (
            ("candidates", 0, "snapshot", "running_output_tokens"),
            [3, -1],
            ["candidates", 0, "snapshot", "running_output_tokens", 1],
            "greater than or equal to 0",
        ),
        (
            ("candidates", 0, "snapshot", "waiting_prefill"),
            [[1]],
            ["candidates", 0, "snapshot", "waiting_prefill", 0],
            "",
        ),
        (("candidates", 0, "snapshot", "colour"), "red", ["candidates", 0, "snapshot", "colour"], "Extra inputs"),
        (("request", "namespace", "block_size_tokens"), 0, ["request", "namespace", "block_size_tokens"], "1"),
        (("request", "namespace", "kv_layout"), "foo", ["request", "namespace", "kv_layout"], "'<dtype>-tp<N>'"),
        (("request", "block_hashes"), [1, 2], ["request"], "exactly one of token_ids or block_hashes"),
        (("request", "input_tokens"), 5, ["request"], "input_tokens = 5 but token_ids has 100 tokens"),
        (("candidates", 1, "worker_id"), 0, ["candidates"], "worker_id [0] listed more than once"),
    ],
)
def test_invalid_input_is_422_naming_the_field(client, path, value, loc, text):
    response = client.post("/v1/score", json=_with(make_body(), path, value))
    assert response.status_code == 422
    detail = response.json()["detail"][0]
    assert detail["loc"][: len(loc) + 1] == ["body", *loc]
    assert text in detail["msg"]
    assert response.json()["message"].startswith(".".join(map(str, loc)))
    assert "input" not in detail  # the body is not echoed back; a short scalar is named in the message
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        assert str(value) in detail["msg"]


def test_fallback_counter_is_exported_at_zero_from_the_start(client):
    # an alert on kvcost_model_fallbacks_total must see 0, not an absent series (kvcost issue 15)
    metrics = client.get("/metrics").text
    assert 'kvcost_model_fallbacks_total{reason="timeout"} 0.0' in metrics
    assert 'kvcost_model_fallbacks_total{reason="load_failed"} 0.0' in metrics


def test_service_level_input_errors_are_422_naming_the_field(client):
    body = make_body(token_ids=None, block_hashes=[1, 2, 3], input_tokens=40)  # 40 tokens hold 2 blocks of 16
    response = client.post("/v1/score", json=body)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "request", "block_hashes"]
    assert response.json()["message"] == ("request.block_hashes: 3 full blocks of 16 tokens exceed input_tokens = 40")
    body = make_body(candidates=[{"worker_id": 0, "snapshot": {"gpu": "tpu"}}])
    response = client.post("/v1/score", json=body)
    assert response.json()["detail"][0]["loc"] == ["body", "candidates", 0, "snapshot", "gpu"]
    assert response.json()["detail"][0]["msg"] == (
        "gpu = 'tpu', expected one of a100, a100-40gb, b200, h100, h100-pcie, h200, l40s, mi300x"
    )
    response = client.post("/v1/workers/1/snapshot", json={"gpu": "tpu"}, headers=AUTH)
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "gpu"]
    response = client.post("/v1/workers/1/snapshot", json={"gpu": ""}, headers=AUTH)  # not the default's null
    assert response.status_code == 422 and response.json()["detail"][0]["msg"].startswith("gpu = '', expected one of")
    response = client.post("/v1/workers/-1/snapshot", json={}, headers=AUTH)
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["path", "worker_id"]


def test_the_worker_id_path_parameter_keeps_its_openapi_bounds(client):
    parameters = client.get("/openapi.json").json()["paths"]["/v1/workers/{worker_id}/snapshot"]["post"]["parameters"]
    assert parameters[0]["schema"] == {"type": "integer", "minimum": 0, "maximum": 2**63 - 1, "title": "Worker Id"}


@pytest.mark.parametrize(("spelling", "read"), [("+0.0", "+0.0"), ("07", "07"), ("7.0", "7.0"), ("%207", " 7")])
def test_a_worker_id_is_read_only_in_decimal_digits(client, spelling, read):
    # pydantic's lax mode reads each of these as an integer; a worker has one spelling
    response = client.post(f"/v1/workers/{spelling}/snapshot", json={}, headers=AUTH)
    assert response.status_code == 422
    assert response.json()["detail"] == [
        {
            "loc": ["path", "worker_id"],
            "msg": f"expected an integer in decimal digits without sign or leading zeros, got {read!r}",
            "type": "value_error",
        }
    ]


def test_block_hashes_route_like_token_ids(client):
    ns = Namespace("m", block_size_tokens=BLOCK)
    hashes = list(block_hashes_for(list(range(100)), BLOCK, ns))
    by_tokens = client.post("/v1/score", json=make_body()).json()
    by_hashes = client.post("/v1/score", json=make_body(token_ids=None, block_hashes=hashes, input_tokens=100)).json()
    assert by_hashes == by_tokens


def test_oversized_body_is_413_by_content_length_and_when_streamed(tmp_path):
    settings = settings_for(tmp_path, max_body_bytes=4096)
    with TestClient(create_app(settings)) as client:
        big = json.dumps(make_body(tokens=2000)).encode()
        assert len(big) > 4096
        response = client.post("/v1/score", content=big, headers={"content-type": "application/json"})
        assert response.status_code == 413
        assert response.json() == {"detail": "request body larger than 4096 bytes"}
        chunks = iter([big[i : i + 1000] for i in range(0, len(big), 1000)])  # no Content-Length: chunked
        response = client.post("/v1/score", content=chunks, headers={"content-type": "application/json"})
        assert response.status_code == 413
        small = json.dumps(make_body(tokens=20)).encode()
        assert client.post("/v1/score", content=iter([small]), headers={"content-type": "application/json"}).is_success


def test_health_ready_and_models_without_registry(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {
        "status": "ready",
        "reason": "no model registry configured: the analytic model by choice",
        "model": "analytic",
    }
    models = client.get("/v1/cost-models").json()
    assert models["serving"]["kind"] == "analytic" and models["versions"] == []
    assert models["registry_uri"] is None and models["feature_spec_hash"] == models["serving"]["feature_spec_hash"]
    assert client.post("/v1/cost-models/reload", headers=AUTH).json()["status"] == "ready"


def learned_set() -> TermModelSet:
    """LightGBM terms fitted to the analytic features (5 rounds) with a conformal P90 bound."""
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (300, len(FEATURE_NAMES)))
    predictors = {}
    for term in TERMS:
        y = x[:, FEATURE_INDEX[f"nominal_{term}_s"]] if term != "transfer" else np.zeros(len(x))
        predictors[term] = make_term_predictor("lightgbm", term, num_boost_round=5).fit(x, y)
    model_set = TermModelSet(predictors, metadata={"predictor": "lightgbm"})
    pred = model_set.predict(x).ttft_s
    model_set.conformal = SplitConformal().fit(pred, pred * 1.2)
    return model_set


class FlakyRegistry:
    """A champion loader that fails until ``up`` is set; ``hang_s`` makes it block first."""

    def __init__(self, hang_s=0.0):
        self.up = False
        self.hang = threading.Event()
        self.hang_s = hang_s
        self.model_set = learned_set()

    def __call__(self):
        if self.hang_s:
            self.hang.wait(self.hang_s)
        if not self.up:
            raise ConnectionError("registry unreachable at http://mlflow:5000\nretries exhausted")
        return self.model_set, "7"


def wait_ready(client, status, attempts=200):
    for _ in range(attempts):
        body = client.get("/readyz").json()
        if body["status"] == status:
            return body
        threading.Event().wait(0.01)
    raise AssertionError(f"/readyz never said {status}: {body}")


def test_unreachable_registry_degrades_to_analytic_and_reload_retries(tmp_path):
    registry = FlakyRegistry()
    settings = settings_for(tmp_path)
    service = ScoringService(settings, model_loader=registry, registry_lister=lambda: [{"version": "7"}])
    with TestClient(create_app(settings, service)) as client:
        degraded = wait_ready(client, "degraded")
        assert degraded["reason"] == (
            "champion not loaded (ConnectionError: registry unreachable at http://mlflow:5000); "
            "scoring with the analytic model"
        )
        assert client.get("/readyz").status_code == 200  # degraded still serves: see the api module docstring
        metrics = client.get("/metrics").text
        assert 'kvcost_model_fallbacks_total{reason="load_failed"} 1.0' in metrics
        assert "kvcost_model_degraded 1.0" in metrics
        scored = client.post("/v1/score", json=make_body()).json()
        assert (scored["model"], scored["learned"]) == ("analytic", False)

        registry.up = True
        reloaded = client.post("/v1/cost-models/reload", headers=AUTH).json()
        assert (reloaded["status"], reloaded["kind"], reloaded["version"]) == ("ready", "learned", "7")
        assert client.get("/readyz").json() == {
            "status": "ready",
            "reason": "champion v7 loaded",
            "model": "champion v7",
        }
        scored = client.post("/v1/score", json=make_body()).json()
        assert (scored["model"], scored["learned"]) == ("champion v7", True)
        assert all(c["p90_s"] is not None and c["p90_s"] >= c["p50_s"] for c in scored["candidates"])
        routed = client.post("/v1/route", json=make_body(request_id=11), headers=AUTH).json()
        chosen = routed["candidates"][routed["chosen_index"]]
        assert chosen["score_s"] == min(c["score_s"] for c in routed["candidates"])  # ranked by calibrated P50

        registry.up = False  # a failed reload keeps the champion already loaded
        kept = client.post("/v1/cost-models/reload", headers=AUTH).json()
        assert (kept["status"], kept["kind"], kept["version"]) == ("degraded", "learned", "7")
        assert kept["reason"].startswith("reload failed (ConnectionError") and kept["reason"].endswith("champion v7")
        assert client.get("/v1/cost-models").json()["versions"] == [{"version": "7"}]
        metrics = client.get("/metrics").text
        assert 'kvcost_model_fallbacks_total{reason="load_failed"} 1.0' in metrics  # no second fallback
        assert "kvcost_model_learned 1.0" in metrics


def test_champion_load_timeout_degrades_and_readyz_says_starting_meanwhile(tmp_path):
    registry = FlakyRegistry(hang_s=5.0)
    settings = settings_for(tmp_path, model_load_timeout_s=0.3)
    with TestClient(create_app(settings, ScoringService(settings, model_loader=registry))) as client:
        starting = client.get("/readyz")
        assert starting.status_code == 503 and starting.json()["status"] == "starting"
        assert client.post("/v1/score", json=make_body()).status_code == 200  # analytic meanwhile
        degraded = wait_ready(client, "degraded")
        assert degraded["reason"] == "champion not loaded (timed out after 0.3 s); scoring with the analytic model"
        assert 'kvcost_model_fallbacks_total{reason="timeout"} 1.0' in client.get("/metrics").text
        registry.hang.set()


def test_observe_while_log_is_failing_is_503_then_succeeds(client):
    service = client.app.state.service
    client.post("/v1/route", json=make_body(request_id=21), headers=AUTH)
    store = service._store
    real = store.append

    def failing(rows):
        raise OSError("disk full")

    store.append = failing
    try:
        response = client.post("/v1/observe", json={"request_id": 21, "ttft_s": 0.1}, headers=AUTH)
    finally:
        store.append = real
    assert response.status_code == 503
    assert response.json()["detail"] == "observation not recorded: OSError: disk full"
    assert client.get("/readyz").json()["status"] == "degraded"
    retried = client.post("/v1/observe", json={"request_id": 21, "ttft_s": 0.1}, headers=AUTH)
    assert retried.status_code == 200 and retried.json()["status"] == "recorded"
    assert client.get("/readyz").json()["status"] == "ready"
    errors = [line for line in client.get("/metrics").text.splitlines() if line.startswith("kvcost_log_write_errors")]
    assert float(errors[0].split()[1]) >= 1  # the failed observation (and the decision if still queued)


def test_candidates_that_cannot_serve_the_namespace_are_left_out(client):
    other = {"model": "other-model", "block_size_tokens": BLOCK}
    resharded = {"model": "m", "block_size_tokens": BLOCK, "kv_layout": "bf16-tp2"}
    candidates = [
        {"worker_id": 0, "snapshot": {"namespace": other}},
        {"worker_id": 1, "snapshot": {"namespace": resharded}},  # same model, other layout: can serve
        {"worker_id": 2, "snapshot": {}},  # says nothing: assumed compatible
    ]
    response = client.post("/v1/score", json=make_body(candidates=candidates))
    assert response.status_code == 200, response.text
    assert [c["worker_id"] for c in response.json()["candidates"]] == [1, 2]
    assert response.json()["namespace_unverified"] is False  # worker 1 declares a namespace that serves it
    unverified = client.post("/v1/score", json=make_body(candidates=candidates[::2])).json()  # 0 left out, 2 silent
    assert ([c["worker_id"] for c in unverified["candidates"]], unverified["namespace_unverified"]) == ([2], True)
    assert 'kvcost_namespace_unverified_total{endpoint="score"} 1.0' in client.get("/metrics").text
    only_other = make_body(candidates=candidates[:1])
    response = client.post("/v1/route", json=only_other, headers=AUTH)
    assert response.status_code == 422
    assert "no candidate serves namespace model='m'" in response.text and "candidates" in response.text


def test_snapshot_sources_stay_with_their_workers_when_the_router_leaves_a_candidate_out(client):
    assert client.post("/v1/workers/2/snapshot", json={}, headers=AUTH).status_code == 200
    other = {"model": "other-model", "block_size_tokens": BLOCK}
    candidates = [{"worker_id": 0, "snapshot": {"namespace": other}}, {"worker_id": 1, "snapshot": {}}]
    response = client.post("/v1/route", json=make_body(candidates=[*candidates, {"worker_id": 2}]), headers=AUTH)
    assert response.status_code == 200, response.text
    out = response.json()
    assert [(c["worker_id"], c["snapshot"]) for c in out["candidates"]] == [(1, "inline"), (2, "pushed")]
    assert out["request_blocks"] == 100 // BLOCK == 6  # from the request, not read back out of the features


@pytest.mark.parametrize("tiers", [False, True])
def test_tiers_price_cpu_resident_prefixes_at_their_load_time(tmp_path, tiers):
    with TestClient(create_app(settings_for(tmp_path, tiers=tiers))) as c:
        service = c.app.state.service
        ns = Namespace("m", block_size_tokens=BLOCK)
        hashes = list(block_hashes_for(list(range(100)), BLOCK, ns))
        service.directory.apply_stored(ns, 1, hashes, None, "cpu", 0.0)  # offloaded by an LMCache-like connector
        out = c.post("/v1/score", json=make_body()).json()["candidates"][1]
    assert (out["reusable_tokens"], out["tier"]) == (96, "cpu")
    lookup_s = 2e-4 + 1e-5 * 6  # 6 full blocks of 16 tokens
    block_bytes = MODELS.get("llama-3-8b").kv_bytes_per_token * BLOCK
    load_s = CPU_TO_GPU.duration_s(6 * block_bytes) if tiers else 0.0  # without tiers: priced as GPU-resident
    assert out["terms"]["lookup_s"] == pytest.approx(lookup_s + load_s)


def test_an_observed_ttft_over_its_served_p90_widens_the_next_bounds(client):
    service = client.app.state.service
    service.routing.set_cost_model(learned_set())
    before = client.post(
        "/v1/route", json=make_body(request_id=5, token_ids=list(range(500, 600))), headers=AUTH
    ).json()
    chosen = before["candidates"][before["chosen_index"]]
    observation = {"request_id": 5, "ttft_s": chosen["p90_s"] + 1.0}  # a miss: θ = 0.05 × 0.9
    assert client.post("/v1/observe", json=observation, headers=AUTH).json()["status"] == "recorded"
    # other tokens of the same length: no reuse of request 5's in-flight prefix, the same terms
    after = client.post("/v1/score", json=make_body(request_id=6, token_ids=list(range(700, 800)))).json()
    assert service.routing.router.interval.updates == 1
    ratios = [a["p90_s"] / b["p90_s"] for a, b in zip(after["candidates"], before["candidates"], strict=True)]
    assert ratios == pytest.approx([np.exp(0.045)] * 2)


def test_a_finished_requests_output_length_reaches_the_routers_decode_length_estimate(client):
    lengths = client.app.state.service.routing.router.decode_lengths
    for request_id, extra in ((11, {}), (12, {"e2e_s": 0.9})):
        client.post("/v1/route", json=make_body(request_id=request_id), headers=AUTH)
        observation = {"request_id": request_id, "ttft_s": 0.05, "output_tokens": 40} | extra
        assert client.post("/v1/observe", json=observation, headers=AUTH).json()["status"] == "recorded"
    # only request 12 says it finished (e2e_s): 40 tokens after the prior of 172 (mean 172.5, weight 100)
    assert lengths.observed == 1
    total = 0.999 * 17250 + 40
    assert lengths.remaining_tokens == pytest.approx((0.999 * 5951250 + 1600 - total) / (2 * total), rel=1e-12)


def test_without_kv_events_a_routed_prefix_counts_as_cached_on_its_worker_until_its_ttl(tmp_path):
    now = [1000.0]
    settings = settings_for(tmp_path, token=False, routed_ttl_s=60.0)
    service = ScoringService(settings, clock=lambda: now[0], model_loader=None, registry_lister=None, roll=None)
    with TestClient(create_app(settings, service)) as client:
        chosen = client.post("/v1/route", json=make_body(1)).json()["worker_id"]
        assert chosen == 1  # worker 0 has 4,000 tokens queued
        scores = client.post("/v1/score", json=make_body(2)).json()["candidates"]
        modes = [(c["reusable_tokens"], c["directory_mode"]) for c in scores]
        assert modes == [(0, "approximate"), (96, "approximate")]
        now[0] += 61.0  # the next route expires it
        client.post("/v1/route", json=make_body(3, token_ids=list(range(500, 520))))
        scores = client.post("/v1/score", json=make_body(4)).json()["candidates"]
        assert [c["reusable_tokens"] for c in scores] == [0, 0]
        client.post("/v1/workers/1/snapshot", json={})  # a worker kvcost knows of shows its mode
        assert 'kvcost_directory_mode{mode="approximate",worker="1"} 1.0' in client.get("/metrics").text
