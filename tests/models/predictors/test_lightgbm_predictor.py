"""Tests for kvcost.models.predictors.lightgbm beyond the contract: fast predict path, model file, params."""

import lightgbm
import numpy as np
import pytest

from kvcost.features.spec import FEATURE_INDEX, FEATURE_NAMES
from kvcost.models.predictors import load_term_predictor, make_term_predictor

from .synthetic import queue_target_s, synthetic_features


def test_fast_predict_path_equals_booster_predict(tiny_features):
    x = synthetic_features(300, seed=2)
    predictor = make_term_predictor("lightgbm", "queue", num_boost_round=50).fit(x, queue_target_s(x))
    assert isinstance(predictor.booster, lightgbm.Booster)
    assert predictor._predict_for_mat is not None, "the direct C call should bind on LightGBM 4.x"
    prior_s = tiny_features[:, FEATURE_INDEX["nominal_queue_s"]]
    reference = np.maximum(predictor.booster.predict(tiny_features, num_threads=1) + prior_s, 0.0)
    assert np.array_equal(predictor.predict_many(tiny_features), reference)
    # A Fortran-ordered input gives the same values.
    assert np.array_equal(predictor.predict_many(np.asfortranarray(tiny_features)), reference)
    predictor._predict_for_mat = None  # the fallback used if LightGBM's private API moves
    assert np.array_equal(predictor.predict_many(tiny_features), reference)


def test_defaults_and_overrides():
    predictor = make_term_predictor("lightgbm", "prefill", num_leaves=7, num_threads=1)
    assert predictor.params["objective"] == "l1"
    assert predictor.params["deterministic"] is True
    assert (predictor.params["num_leaves"], predictor.params["num_threads"]) == (7, 1)
    assert predictor.params["num_boost_round"] == 150


def test_num_boost_round_and_leaves_reach_the_booster(tiny_features):
    y = queue_target_s(tiny_features)
    predictor = make_term_predictor("lightgbm", "queue", num_boost_round=12, num_leaves=3, min_data_in_leaf=5)
    booster = predictor.fit(tiny_features, y).booster
    assert booster.num_trees() == 12
    assert max(tree["num_leaves"] for tree in booster.dump_model()["tree_info"]) <= 3
    assert booster.feature_name() == list(FEATURE_NAMES)


def test_model_file_is_lightgbm_text(tiny_features, tmp_path):
    predictor = make_term_predictor("lightgbm", "queue", num_boost_round=5)
    predictor.fit(tiny_features, queue_target_s(tiny_features)).save(tmp_path)
    text = (tmp_path / "model.txt").read_text()
    assert text.startswith("tree\n")
    assert "feature_names=" + " ".join(FEATURE_NAMES) in text
    assert isinstance(load_term_predictor(tmp_path).booster, lightgbm.Booster)


def test_zero_weight_rows_are_ignored():
    x = synthetic_features(400, seed=4)
    y = np.where(np.arange(400) % 2 == 0, 1.0, 100.0)
    w = np.where(np.arange(400) % 2 == 0, 1.0, 0.0)
    predictor = make_term_predictor("lightgbm", "queue", num_boost_round=50, residual_of_nominal=False)
    assert np.allclose(predictor.fit(x, y, sample_weight=w).predict_many(x), 1.0, atol=0.01)


def test_residual_target_adds_the_analytic_prior():
    # target = nominal + 0.5 s exactly: the booster learns the constant 0.5 s, the prior carries the rest,
    # including nominal values far beyond the training range (a plain tree would flatten there)
    x = synthetic_features(400, seed=5)
    nominal_s = x[:, FEATURE_INDEX["nominal_queue_s"]]
    predictor = make_term_predictor("lightgbm", "queue", num_boost_round=20).fit(x, nominal_s + 0.5)
    far = x[:3].copy()
    far[:, FEATURE_INDEX["nominal_queue_s"]] = [1e3, 2e3, 5e3]
    assert predictor.predict_many(far) == pytest.approx([1000.5, 2000.5, 5000.5], abs=1e-6)
    assert np.allclose(predictor.booster.predict(x), 0.5, atol=1e-6)
    plain = make_term_predictor("lightgbm", "queue", num_boost_round=20, residual_of_nominal=False)
    assert plain.fit(x, nominal_s + 0.5).predict_many(far).max() < nominal_s.max() + 0.5 + 1e-6
    # transfer's prior (nominal_transfer_s) is 0 when no fetch is planned: the booster learns it all
    transfer = make_term_predictor("lightgbm", "transfer", num_boost_round=5).fit(x, np.full(400, 0.25))
    assert transfer.predict_many(far) == pytest.approx([0.25] * 3, abs=1e-6)
