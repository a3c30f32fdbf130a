"""Tests for kvcost.models.analytic (AnalyticCostModel)."""

import numpy as np
import pytest

from kvcost.features.spec import FEATURE_INDEX, FEATURE_NAMES
from kvcost.models.analytic import AnalyticCostModel


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
    p = AnalyticCostModel().predict(x)
    assert p.queue_s.tolist() == [0.25, 0.03]
    assert p.lookup_s.tolist() == [0.005, 0.0]
    assert p.transfer_s.tolist() == [0.0, 0.0]
    assert p.prefill_s.tolist() == [0.015, 0.18]
    assert p.first_token_s.tolist() == [0.0, 0.002]
    assert p.ttft_s.tolist() == pytest.approx([0.27, 0.212])


def test_negative_columns_clamped_to_zero():
    p = AnalyticCostModel().predict(features([{"nominal_queue_s": -1.0, "nominal_prefill_s": 0.1}]))
    assert p.queue_s.tolist() == [0.0]
    assert p.ttft_s.tolist() == pytest.approx([0.1])


def test_does_not_mutate_features_and_name():
    x = features([{"nominal_queue_s": -1.0}])
    before = x.copy()
    AnalyticCostModel().predict(x)
    assert np.array_equal(x, before)
    assert AnalyticCostModel.name == "analytic"


def test_empty_candidates():
    p = AnalyticCostModel().predict(np.zeros((0, len(FEATURE_NAMES))))
    assert p.ttft_s.shape == (0,)
