"""MLflow round trip in a temporary store: register, load by alias, promotion gate, forced promotion, fallback."""

import numpy as np
import pandas as pd
import pytest

from kvcost.core.composition import TERMS
from kvcost.features.spec import FEATURE_INDEX, FEATURE_NAMES
from kvcost.models import mlflow_store
from kvcost.models.training import evaluate, feature_matrix, split_by_time, train_term_set

pytestmark = pytest.mark.slow


def _frame(n=1200, seed=0):
    rng = np.random.default_rng(seed)
    x = np.zeros((n, len(FEATURE_NAMES)))
    x[:, FEATURE_INDEX["nominal_queue_s"]] = rng.uniform(0, 2, n)
    frame = pd.DataFrame(x, columns=list(FEATURE_NAMES))
    for term in TERMS:
        frame[f"actual_{term}_s"] = 0.0
    frame["actual_queue_s"] = 2 * frame["nominal_queue_s"] + rng.uniform(0, 0.05, n)
    frame["actual_ttft_s"] = frame["actual_queue_s"]
    frame["arrival_s"] = np.arange(n, dtype=float)
    return frame


@pytest.fixture(autouse=True)
def no_requirement_inference(monkeypatch):
    """Skip MLflow's pip-requirement inference for the per-term LightGBM copies: it loads each logged
    model in a fresh Python subprocess (~5 s of CPU each, ten per test) to list its imports. MLflow logs
    its fallback list (the flavour's defaults) whenever inference fails; nothing here reads either."""
    import mlflow.models

    monkeypatch.setattr(mlflow.models, "infer_pip_requirements", lambda *args, fallback=None, **kwargs: fallback)


@pytest.fixture
def store(tmp_path):
    return f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "artifacts"


def _register(store, rounds, frame=None, **params):
    uri, root = store
    split = split_by_time(_frame() if frame is None else frame)
    model_set = train_term_set(split, "lightgbm", num_boost_round=rounds, **params)
    ev = evaluate(model_set, split.holdout)
    return model_set, split, mlflow_store.log_and_register(model_set, ev, split.holdout, {"test": True}, uri, root)


def test_round_trip_gate_and_force(store):
    uri, _ = store
    with pytest.raises(LookupError, match="no kvcost-terms version with alias 'champion'"):
        mlflow_store.load_model_set(uri)  # empty registry: the router falls back to analytic
    model_set, split, first = _register(store, rounds=50)
    assert first.version == "1"
    loaded = mlflow_store.load_model_set(uri, alias="challenger")
    x = feature_matrix(split.holdout)
    assert np.array_equal(loaded.predict(x).ttft_s, model_set.predict(x).ttft_s)
    assert mlflow_store.promote(uri).promoted  # no champion yet: the first challenger passes

    # worse: one boosting round, without the analytic prior to start from, underfits the same data
    _register(store, rounds=1, residual_of_nominal=False)
    refused = mlflow_store.promote(uri)
    assert not refused.promoted and refused.version == "2"
    assert refused.challenger["ttft_mae_s"] > refused.champion["ttft_mae_s"]
    assert refused.message == "version 2 refused: worse than champion; gated on TTFT MAE and coverage only (no replay)"
    with pytest.raises(ValueError, match="needs a reason"):
        mlflow_store.promote(uri, force=True)
    forced = mlflow_store.promote(uri, force=True, reason="testing the override")
    assert (
        forced.promoted
        and forced.message
        == "version 2 promoted by force: testing the override; gated on TTFT MAE and coverage only (no replay)"
    )
    versions = {v["version"]: v["aliases"] for v in mlflow_store.list_versions(uri)}
    assert versions == {"2": ["challenger", "champion"], "1": []}


def test_without_a_champion_the_challenger_must_beat_the_analytic_model(store):
    uri, _ = store
    exact = _frame()
    exact["actual_queue_s"] = exact["actual_ttft_s"] = exact["nominal_queue_s"]  # the profile is exact
    _register(store, rounds=1, frame=exact, residual_of_nominal=False)
    refused = mlflow_store.promote(uri)
    assert not refused.promoted and refused.champion is None
    assert refused.challenger["analytic_ttft_mae_s"] == 0.0 < refused.challenger["ttft_mae_s"]
    assert (
        refused.message
        == "version 1 refused: worse than the analytic model; gated on TTFT MAE and coverage only (no replay)"
    )


def test_a_routing_gate_can_refuse_what_the_holdout_accepts(store):
    uri, _ = store
    _register(store, rounds=50)
    seen = []

    def gate(challenger, champion):
        seen.append((challenger.learned, champion))
        figures = {"challenger": {"ttft_p99_s": 2.0}, "champion": {"ttft_p99_s": 1.0}}
        return mlflow_store.RoutingVerdict(False, figures, "replay: P99 2.0 s vs 1.0 s")

    refused = mlflow_store.promote(uri, routing_gate=gate)
    assert seen == [(True, None)]  # no champion yet: compared with the analytic routing
    assert not refused.promoted and refused.routing.figures["challenger"] == {"ttft_p99_s": 2.0}
    assert refused.message == "version 1 refused: worse than the analytic model; replay: P99 2.0 s vs 1.0 s"


def test_a_champion_under_another_feature_spec_does_not_block_promotion(store, monkeypatch):
    uri, _ = store
    _register(store, rounds=50)
    assert mlflow_store.promote(uri).promoted
    # the spec changes (a new kvcost): version 1 can no longer be loaded, by the router or the gate
    import kvcost.models.predictors.base as base
    import kvcost.models.term_set as term_set

    monkeypatch.setattr(term_set, "feature_spec_hash", lambda: "0123456789abcdef")
    monkeypatch.setattr(base, "feature_spec_hash", lambda: "0123456789abcdef")
    _register(store, rounds=50)
    promoted = mlflow_store.promote(uri)
    assert promoted.promoted and promoted.champion is None
    assert promoted.message.startswith("version 2 promoted (champion version 1 cannot be loaded, so no gate: ")
    assert mlflow_store.load_model_set(uri).metadata["feature_spec_hash"] == "0123456789abcdef"


def test_artifacts_live_beside_a_sqlite_store_and_where_a_server_says():
    from pathlib import Path

    assert mlflow_store.artifact_root_for(None) == Path("runs/mlartifacts")
    assert mlflow_store.artifact_root_for("sqlite:////tmp/x/mlflow.db") == Path("/tmp/x/mlartifacts")
    assert mlflow_store.artifact_root_for("http://mlflow:5000") is None


def test_listing_a_sqlite_store_that_does_not_exist_creates_nothing(tmp_path):
    db = tmp_path / "mlflow.db"
    assert mlflow_store.list_versions(f"sqlite:///{db}") == []
    assert not db.exists() and list(tmp_path.iterdir()) == []
