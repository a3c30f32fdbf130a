"""Tests for kvcost.models.term_set (TermModelSet), its analytic form and persistence."""

import json

import numpy as np
import pytest

from kvcost.features.spec import FEATURE_INDEX, FEATURE_NAMES
from kvcost.models.predictors import FeatureSpecMismatch, make_term_predictor
from kvcost.models.term_set import TermModelSet


def features(rows):
    """Feature matrix with only the given ``{name: value}`` set per row (others 0)."""
    x = np.zeros((len(rows), len(FEATURE_NAMES)))
    for i, row in enumerate(rows):
        for name, value in row.items():
            x[i, FEATURE_INDEX[name]] = value
    return x


def test_reads_nominal_columns_and_composes():
    x = features(
        [
            {
                "nominal_queue_s": 0.25,
                "nominal_lookup_s": 0.005,
                "nominal_prefill_s": 0.015,
                "input_tokens": 9000,
                "reusable_tokens": 8192,
            },
            {"nominal_queue_s": 0.03, "nominal_prefill_s": 0.18, "nominal_first_token_s": 0.002},
        ]
    )
    p = TermModelSet.analytic().predict(x)
    assert p.queue_s.tolist() == [0.25, 0.03]
    assert p.lookup_s.tolist() == [0.005, 0.0]
    assert p.transfer_s.tolist() == [0.0, 0.0]
    assert p.prefill_s.tolist() == [0.015, 0.18]
    assert p.first_token_s.tolist() == [0.0, 0.002]
    assert p.ttft_s.tolist() == pytest.approx([0.27, 0.212])


def test_negative_columns_clamped_to_zero():
    p = TermModelSet.analytic().predict(features([{"nominal_queue_s": -1.0, "nominal_prefill_s": 0.1}]))
    assert p.queue_s.tolist() == [0.0]
    assert p.ttft_s.tolist() == pytest.approx([0.1])


def test_does_not_mutate_features_and_name():
    x = features([{"nominal_queue_s": -1.0}])
    before = x.copy()
    TermModelSet.analytic().predict(x)
    assert np.array_equal(x, before)
    assert not TermModelSet.analytic().learned


def test_empty_candidates():
    p = TermModelSet.analytic().predict(np.zeros((0, len(FEATURE_NAMES))))
    assert p.ttft_s.shape == (0,)


def _learned_set(rng):
    x = rng.uniform(0, 1, (400, len(FEATURE_NAMES)))
    predictors = {}
    for term in ("queue", "lookup", "transfer", "prefill", "first_token"):
        y = x[:, FEATURE_INDEX[f"nominal_{term}_s"]] if term != "transfer" else np.zeros(len(x))
        predictors[term] = make_term_predictor("lightgbm", term, num_boost_round=5).fit(x, y)
    return TermModelSet(predictors), x


def test_save_load_round_trip_and_spec_guard(tmp_path):
    model_set, x = _learned_set(np.random.default_rng(0))
    assert model_set.learned
    path = model_set.save(tmp_path / "set")
    loaded = TermModelSet.load(path)
    assert np.array_equal(loaded.predict(x).ttft_s, model_set.predict(x).ttft_s)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["metadata"]["feature_spec_hash"] = "0000"
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(FeatureSpecMismatch, match="trained with feature spec 0000, this kvcost uses"):
        TermModelSet.load(path)


def test_missing_term_and_missing_folder(tmp_path):
    with pytest.raises(ValueError, match=r"predictors lacks term\(s\) \['transfer'\]"):
        TermModelSet({t: make_term_predictor("analytic", t) for t in ("queue", "lookup", "prefill", "first_token")})
    with pytest.raises(FileNotFoundError, match="no manifest.json"):
        TermModelSet.load(tmp_path)


def test_uncalibrated_set_passes_ttft_through_and_has_no_bound():
    x = features([{"nominal_queue_s": 0.25, "nominal_prefill_s": 0.02}])
    model_set = TermModelSet.analytic()
    calibrated = model_set.calibrate(model_set.predict(x))
    assert calibrated.p50_s.tolist() == pytest.approx([0.27])
    assert np.isnan(calibrated.p90_s).all()


def test_analytic_terms_with_a_fitted_bound_are_calibrated_not_learned():
    from kvcost.calibration.conformal import SplitConformal

    model_set = TermModelSet.analytic()
    assert (model_set.learned, model_set.calibrated) == (False, False)
    model_set.conformal = SplitConformal().fit(np.array([1.0] * 10), np.array([1.5] * 10))
    assert (model_set.learned, model_set.calibrated) == (False, True)
    x = features([{"nominal_queue_s": 0.25, "nominal_prefill_s": 0.75}])
    calibrated = model_set.calibrate(model_set.predict(x))
    assert (calibrated.p50_s.tolist(), calibrated.p90_s.tolist()) == ([1.0], [1.5])  # actuals were 1.5 × predicted
