"""Tests for kvcost.models.training: the log join, time splits, metrics, training and evaluation."""

from datetime import datetime

import numpy as np
import pandas as pd
import pytest

from kvcost.core.composition import TERMS
from kvcost.data.store import LogStore
from kvcost.features.spec import FEATURE_INDEX, FEATURE_NAMES
from kvcost.models.training import (
    error_metrics,
    evaluate,
    feature_matrix,
    load_training_frame,
    load_unchosen_features,
    split_by_time,
    train_term_set,
)


def _requests(ids, arrivals, queue_s):
    n = len(ids)
    frame = pd.DataFrame({"request_id": ids, "arrival_s": arrivals, "worker_id": [0] * n})
    for col in ("input_tokens", "output_tokens", "predicted_reuse_tokens", "actual_reuse_tokens"):
        frame[col] = 100
    for prefix in ("pred", "actual"):
        for term in (*TERMS, "ttft"):
            frame[f"{prefix}_{term}_s"] = 0.0
    frame["actual_queue_s"] = queue_s
    frame["actual_ttft_s"] = queue_s
    frame["tpot_s"] = frame["e2e_s"] = 0.0
    frame["directory_mismatch_tokens"] = 0
    frame["mismatch_lost_s"] = 0.0
    frame["served_by"] = "recompute"
    frame["directory_reuse_tokens"] = None
    frame["client_request_id"] = None
    frame["outcome"] = None
    frame["kv_wait_s"] = 0.0
    frame["preemptions"] = 0
    return frame


def _candidates(ids, chosen_worker=0):
    rows = []
    for rid in ids:
        for worker in (0, 1):
            row = {"request_id": rid, "worker_id": worker, "chosen": worker == chosen_worker}
            row |= {name: float(rid) if name == "nominal_queue_s" else 0.0 for name in FEATURE_NAMES}
            row |= {f"pred_{t}_s": 0.0 for t in (*TERMS, "ttft")}
            rows.append(row)
    return pd.DataFrame(rows)


@pytest.fixture
def log(tmp_path):
    path = tmp_path / "log.duckdb"
    with LogStore(path).open() as store:
        store.write_run("a", "cost_aware", "t", {}, datetime(2026, 1, 1))
        store.write_frame("requests", "a", _requests([0, 1, 2], [5.0, 1.0, 3.0], [0.5, 0.1, 0.3]))
        store.write_frame("candidates", "a", _candidates([0, 1, 2]))
        store.write_run("b", "cost_aware", "t", {}, datetime(2026, 1, 1))
        store.write_frame("requests", "b", _requests([7], [2.0], [0.2]))
        store.write_frame("candidates", "b", _candidates([7]))
        store.connection.execute("UPDATE runs SET feature_spec_hash = 'old' WHERE run_id = 'b'")
    return path


def test_frame_joins_chosen_candidates_in_time_order_and_skips_other_specs(log):
    frame = load_training_frame(log)
    assert frame["request_id"].tolist() == [1, 2, 0]  # by arrival; run b has another feature spec
    assert frame["arrival_s"].tolist() == [1.0, 3.0, 5.0]
    assert frame["actual_queue_s"].tolist() == [0.1, 0.3, 0.5]
    assert frame["nominal_queue_s"].tolist() == [1.0, 2.0, 0.0]
    assert list(load_training_frame(log, ["a"])["request_id"]) == [1, 2, 0]


def test_frame_errors(log, tmp_path):
    with pytest.raises(ValueError, match=r"no completed requests for runs \['b'\] logged with feature spec"):
        load_training_frame(log, ["b"])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_training_frame(tmp_path / "missing.duckdb")


def test_split_by_time_is_ordered_and_exact():
    frame = pd.DataFrame({"arrival_s": np.arange(10.0)})
    split = split_by_time(frame, 0.5, 0.1)
    assert split.train["arrival_s"].tolist() == [0, 1, 2, 3, 4]
    assert split.calibration["arrival_s"].tolist() == [5]
    assert split.holdout["arrival_s"].tolist() == [6, 7, 8, 9]
    with pytest.raises(ValueError, match="expected both in"):
        split_by_time(frame, 0.9, 0.2)
    with pytest.raises(ValueError, match="too few to split"):
        split_by_time(frame.iloc[:3], 0.5, 0.1)


def test_error_metrics_exact():
    m = error_metrics(np.array([0.1, 0.5, 2.0, 0.0]), np.array([0.2, 0.5, 1.0, 0.05]))
    assert m["mae_s"] == pytest.approx((0.1 + 0 + 1.0 + 0.05) / 4)
    assert m["mape"] == pytest.approx((0.1 / 0.2 + 0.0 / 0.5 + 1.0 / 1.0) / 3)  # only actual > 100 ms
    assert m["p90_abs_error_s"] == pytest.approx(np.quantile([0.1, 0, 1.0, 0.05], 0.9))


def test_training_recovers_a_known_relation():
    """actual queue = 2 × nominal queue + 30 ms per waiting request; the analytic model only knows the first half."""
    rng = np.random.default_rng(0)
    n = 3000
    x = np.zeros((n, len(FEATURE_NAMES)))
    x[:, FEATURE_INDEX["nominal_queue_s"]] = rng.uniform(0, 2, n)
    x[:, FEATURE_INDEX["waiting_requests"]] = rng.integers(0, 20, n)
    frame = pd.DataFrame(x, columns=list(FEATURE_NAMES))
    queue = 2 * frame["nominal_queue_s"] + 0.03 * frame["waiting_requests"] + rng.normal(0, 0.01, n).clip(-0.02, 0.02)
    for term in TERMS:
        frame[f"actual_{term}_s"] = 0.0
    frame["actual_queue_s"] = queue.clip(lower=0)
    frame["actual_ttft_s"] = frame["actual_queue_s"]
    frame["arrival_s"] = np.arange(n, dtype=float)
    split = split_by_time(frame)
    model_set = train_term_set(split, "lightgbm", num_boost_round=200)
    ev = evaluate(model_set, split.holdout)
    assert ev["learned"]["queue"]["mae_s"] < 0.05  # stated tolerance: 50 ms on a 0–4.6 s target
    assert ev["learned"]["ttft"]["mae_s"] < 0.1 * ev["analytic"]["ttft"]["mae_s"]
    assert 0.85 <= ev["coverage_90"] <= 0.95
    assert model_set.metadata["rows"] == {"train": 1200, "calibration": 600, "holdout": 1200}


def _doubled_queue_frame(n: int = 1000, other_terms_s: float = 0.0) -> pd.DataFrame:
    """``n`` rows (seed 0) whose actual queue is twice its nominal (uniform 0–2 s); every other term is
    ``other_terms_s``; TTFT = the queue; arrivals 1 s apart."""
    rng = np.random.default_rng(0)
    x = np.zeros((n, len(FEATURE_NAMES)))
    x[:, FEATURE_INDEX["nominal_queue_s"]] = rng.uniform(0, 2, n)
    frame = pd.DataFrame(x, columns=list(FEATURE_NAMES))
    for term in TERMS:
        frame[f"actual_{term}_s"] = other_terms_s
    frame["actual_queue_s"] = 2 * frame["nominal_queue_s"]
    frame["actual_ttft_s"] = frame["actual_queue_s"]
    frame["arrival_s"] = np.arange(n, dtype=float)
    return frame


def test_rows_observed_with_ttft_alone_train_only_the_calibration():
    """A live service may log TTFT without its terms (NULL): each term trains on the rows that have it."""
    frame = _doubled_queue_frame(other_terms_s=0.0)
    frame.loc[::2, [f"actual_{t}_s" for t in TERMS]] = np.nan  # every other row: TTFT only
    split = split_by_time(frame)
    ev = evaluate(train_term_set(split, "lightgbm", num_boost_round=100), split.holdout)
    assert ev["learned"]["queue"]["mae_s"] < 0.05 and ev["rows"] == 400
    # a live engine: TTFT and queue only; prefill is fitted on what TTFT leaves, the rest stay analytic
    live = frame.copy()
    live[[f"actual_{t}_s" for t in TERMS if t != "queue"]] = np.nan
    live["actual_queue_s"] = 2 * live["nominal_queue_s"]
    live["actual_ttft_s"] = live["actual_queue_s"] + 0.25
    model_set = train_term_set(split_by_time(live), "lightgbm", num_boost_round=100)
    assert model_set.metadata["unobserved_terms"] == {
        "lookup": "analytic", "transfer": "analytic", "prefill": "fitted on TTFT less the other terms",
        "first_token": "analytic",
    }  # fmt: skip
    assert model_set.predictors["lookup"].name == "analytic"
    prefill_s = model_set.predictors["prefill"].predict_many(feature_matrix(live.iloc[:5]))
    np.testing.assert_allclose(prefill_s, 0.25, atol=0.01)  # the analytic terms are 0 on these rows
    assert np.isnan(error_metrics(np.array([]), np.array([]))["mae_s"])


def test_unchosen_features_are_the_rejected_candidates_of_the_training_requests(log, tmp_path):
    frame = load_training_frame(log)
    unchosen = load_unchosen_features(log, frame.iloc[:2], limit=10)  # requests 1 and 2: worker 1 was rejected
    assert unchosen.shape == (2, len(FEATURE_NAMES))
    assert sorted(unchosen[:, FEATURE_NAMES.index("nominal_queue_s")].tolist()) == [1.0, 2.0]
    assert load_unchosen_features(log, frame.iloc[:2], limit=1).shape == (1, len(FEATURE_NAMES))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_unchosen_features(tmp_path / "missing.duckdb", frame, limit=10)


def test_rows_with_an_unknown_ttft_are_left_out_of_the_calibration_and_the_metrics():
    """A gateway logs a non-streamed request's TTFT as unknown (NULL): MAE and coverage stay numbers."""
    frame = _doubled_queue_frame(other_terms_s=np.nan)
    frame["actual_ttft_s"] = frame["actual_queue_s"] + 0.25
    frame.loc[::5, "actual_ttft_s"] = np.nan  # every fifth request was not streamed
    split = split_by_time(frame)
    model_set = train_term_set(split, "lightgbm", num_boost_round=100)
    assert np.isfinite(model_set.conformal.upper_bounds(np.array([1.0]))[0.9]).all()
    ev = evaluate(model_set, split.holdout)
    assert ev["rows"] == 400 and np.isfinite(ev["learned"]["ttft"]["mae_s"])
    streamed = split.holdout["actual_ttft_s"].notna()
    analytic_error_s = (split.holdout["nominal_queue_s"] + 0.25)[streamed].mean()  # the profile knows half the queue
    assert ev["analytic"]["ttft"]["mae_s"] == pytest.approx(analytic_error_s) and streamed.sum() == 320
    assert ev["learned"]["ttft"]["mae_s"] < 0.05
    assert 0.8 <= ev["coverage_90"] <= 1.0  # over the 320 holdout rows with a TTFT
