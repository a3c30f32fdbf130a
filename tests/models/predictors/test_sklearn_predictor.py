"""Tests for kvcost.models.predictors.sklearn beyond the contract."""

import numpy as np
from sklearn.ensemble import HistGradientBoostingRegressor

from kvcost.models.predictors import load_term_predictor, make_term_predictor

from .synthetic import queue_target_s, synthetic_features


def test_estimator_is_exposed_with_the_configured_params(tiny_features, tmp_path):
    predictor = make_term_predictor("sklearn", "queue", max_iter=20)
    assert predictor.estimator is None
    predictor.fit(tiny_features, queue_target_s(tiny_features))
    estimator = predictor.estimator
    assert isinstance(estimator, HistGradientBoostingRegressor)
    assert (estimator.loss, estimator.max_iter, estimator.early_stopping, estimator.random_state) == (
        "absolute_error",
        20,
        False,
        0,
    )
    assert estimator.n_iter_ == 20
    predictor.save(tmp_path)
    assert (tmp_path / "model.joblib").is_file()
    assert isinstance(load_term_predictor(tmp_path).estimator, HistGradientBoostingRegressor)


def test_zero_weight_rows_are_ignored():
    x = synthetic_features(400, seed=4)
    y = np.where(np.arange(400) % 2 == 0, 1.0, 100.0)
    w = np.where(np.arange(400) % 2 == 0, 1.0, 0.0)
    predictor = make_term_predictor("sklearn", "queue", max_iter=50).fit(x, y, sample_weight=w)
    assert np.allclose(predictor.predict_many(x), 1.0, atol=0.01)
