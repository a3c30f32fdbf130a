"""Tests for kvcost.models.predictors.analytic (the unlearned prior)."""

import numpy as np
import pytest

from kvcost.core.composition import TERMS
from kvcost.features.spec import FEATURE_INDEX, FEATURE_NAMES
from kvcost.models.predictors import make_term_predictor
from kvcost.models.predictors.analytic import added_columns, nominal_column


def rows(values: dict[str, list[float]]) -> np.ndarray:
    n = len(next(iter(values.values())))
    x = np.zeros((n, len(FEATURE_NAMES)))
    for name, column in values.items():
        x[:, FEATURE_INDEX[name]] = column
    return x


def test_reads_its_nominal_column_exactly_and_clips_negative():
    x = rows(
        {
            "nominal_queue_s": [0.25, -0.01, 0.03],
            "nominal_lookup_s": [0.005, 0.0, 2e-4],
            "nominal_prefill_s": [0.015, 0.18, 0.0],
            "nominal_first_token_s": [0.002, 0.002, 0.002],
        }
    )
    assert make_term_predictor("analytic", "queue").predict_many(x).tolist() == [0.25, 0.0, 0.03]
    assert make_term_predictor("analytic", "lookup").predict_many(x).tolist() == [0.005, 0.0, 2e-4]
    assert make_term_predictor("analytic", "prefill").predict_many(x).tolist() == [0.015, 0.18, 0.0]
    assert make_term_predictor("analytic", "first_token").predict_many(x).tolist() == [0.002, 0.002, 0.002]
    assert make_term_predictor("analytic", "transfer").predict_many(x).tolist() == [0.0, 0.0, 0.0]  # no fetch


def test_the_queue_adds_the_kv_wait_estimate_and_no_other_term_does():
    x = rows(
        {
            "nominal_queue_s": [0.25, 0.0, -0.5],
            "kv_wait_estimate_s": [1.5, 0.125, 0.25],
            "nominal_prefill_s": [0.015, 0.18, 0.0],
        }
    )
    assert make_term_predictor("analytic", "queue").predict_many(x).tolist() == [1.75, 0.125, 0.0]
    assert make_term_predictor("analytic", "prefill").predict_many(x).tolist() == [0.015, 0.18, 0.0]
    assert added_columns("queue") == [FEATURE_INDEX["kv_wait_estimate_s"]]
    assert added_columns("queue", {"nominal_queue_s": 0}) == []  # a spec without the estimate
    assert [added_columns(term) for term in TERMS if term != "queue"] == [[]] * (len(TERMS) - 1)


def test_returns_a_new_array_not_a_view_of_the_input():
    x = rows({"nominal_queue_s": [0.25, 0.5]})
    y = make_term_predictor("analytic", "queue").predict_many(x)
    y[:] = 9.0
    assert x[:, FEATURE_INDEX["nominal_queue_s"]].tolist() == [0.25, 0.5]


def test_every_term_has_a_nominal_column():
    assert all(nominal_column(term) is not None for term in TERMS)


def test_a_spec_without_the_column_predicts_zero():
    assert nominal_column("transfer", {"nominal_queue_s": 0}) is None


def test_fit_is_a_no_op_and_parameters_are_refused():
    x = rows({"nominal_queue_s": [0.25, 0.5]})
    predictor = make_term_predictor("analytic", "queue")
    assert predictor.params == {}
    assert predictor.fit(x, np.array([9.0, 9.0])).predict_many(x).tolist() == [0.25, 0.5]
    with pytest.raises(ValueError, match=r"unknown analytic predictor parameter\(s\) scale; expected \(none\)"):
        make_term_predictor("analytic", "queue", scale=2.0)
