"""Tests for kvcost.routing.policies.llmd_latency (the ``llmd_predicted_latency`` anchor)."""

import functools
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from kvcost.core.types import DirectoryMatch
from kvcost.features.spec import FEATURE_INDEX, FEATURE_NAMES
from kvcost.routing.policies import ROUTER_POLICIES, make_policy
from kvcost.routing.policies.basic import CostAwarePolicy
from kvcost.routing.policies.llmd import LlmdDefaultPolicy
from kvcost.routing.policies.llmd_latency import (
    LLMD_FEATURES,
    LlmdPredictedLatencyPolicy,
    QuantileTTFTModel,
    llmd_features,
)

from .helpers import context, with_cache_and_ttft


def feature_rows(queued_prefill_tokens):
    """Feature rows, all zero but ``queued_prefill_tokens``, shape ``(n, len(FEATURE_NAMES))``."""
    rows = np.zeros((len(queued_prefill_tokens), len(FEATURE_NAMES)))
    rows[:, FEATURE_INDEX["queued_prefill_tokens"]] = queued_prefill_tokens
    return rows


def training_rows():
    """40 outcomes: idle pods (16 × 0.1 s, 4 × 0.5 s: P90 0.5 s) and busy ones (16 × 1 s, 4 × 3 s: P90 3 s)."""
    frame = pd.DataFrame(feature_rows([0] * 20 + [1000] * 20), columns=list(FEATURE_NAMES))
    frame["actual_ttft_s"] = [0.1] * 16 + [0.5] * 4 + [1.0] * 16 + [3.0] * 4
    return frame


@pytest.fixture
def two_pods(linear_step_model, make_snapshot):
    """Worker 10 busy (1000 queued tokens, predicted 0.1 s by the cost model), worker 11 idle (0.2 s)."""
    snapshots = [make_snapshot(10), make_snapshot(11, kv_usage=0.5)]
    ctx = with_cache_and_ttft(context(linear_step_model, snapshots, [1, 2]), [0, 0], [0.1, 0.2])
    matches = tuple(DirectoryMatch(s.worker_id, 0, "none", 0.0) for s in snapshots)
    return replace(ctx, features=feature_rows([1000, 0]), matches=matches)


@functools.cache
def _trained_model() -> QuantileTTFTModel:
    policy = LlmdPredictedLatencyPolicy()
    policy.fit_own_model(training_rows())
    return policy.model


def fitted(**params):
    """A policy whose model was fitted on :func:`training_rows` (the fit is shared: the policies only read it)."""
    policy = LlmdPredictedLatencyPolicy(**params)
    policy.model = _trained_model()
    return policy


def test_registered_as_learned_with_its_own_model():
    assert ROUTER_POLICIES.get("llmd_predicted_latency") is LlmdPredictedLatencyPolicy
    policy = make_policy("llmd_predicted_latency")
    assert (policy.name, policy.learned, policy.own_model, policy.ttft_slo_s) == (
        "llmd_predicted_latency",
        True,
        True,
        None,
    )
    assert (policy.aci.target_miss_rate, policy.aci.step_s, policy.model.params["alpha"]) == (
        pytest.approx(0.1),
        0.01,
        0.9,
    )


def test_features_from_the_kvcost_row():
    row = np.zeros((1, len(FEATURE_NAMES)))
    for name, value in [
        ("kv_usage", 0.5),
        ("input_tokens", 200),
        ("waiting_requests", 2),
        ("running_requests", 3),
        ("queued_prefill_tokens", 300),
        ("decode_context_tokens", 400),
        ("reusable_tokens", 50),
    ]:
        row[0, FEATURE_INDEX[name]] = value
    np.testing.assert_array_equal(llmd_features(row), [[0.5, 200, 2, 3, 300, 400, 0.25]])
    assert len(LLMD_FEATURES) == 7
    with pytest.raises(ValueError, match=r"features has shape \(3,\)"):
        llmd_features(np.zeros(3))


def test_quantile_regressor_fits_the_p90_not_the_mean():
    frame = training_rows()
    model = QuantileTTFTModel().fit(llmd_features(frame[list(FEATURE_NAMES)].to_numpy()), frame["actual_ttft_s"])
    # P90 of each group (0.5 s and 3 s); their means would be 0.18 s and 1.4 s
    np.testing.assert_allclose(model.predict(llmd_features(feature_rows([0, 1000]))), [0.5, 3.0], atol=1e-6)
    assert model.rows == 40


def test_predict_before_fit_and_fit_without_rows_are_refused():
    with pytest.raises(ValueError, match="not fitted yet"):
        QuantileTTFTModel().predict(np.zeros((1, 7)))
    with pytest.raises(ValueError, match="x has 0 rows"):
        QuantileTTFTModel().fit(np.zeros((0, 7)), np.zeros(0))


def test_cold_start_routes_by_the_llmd_default_profile_and_learns_nothing(two_pods):
    policy = LlmdPredictedLatencyPolicy()
    index, reason = policy.choose(two_pods)
    default_index, default_reason = LlmdDefaultPolicy().choose(two_pods)
    prefix = "cold start (no latency model yet), llm-d default profile: "
    assert (index, reason) == (default_index, prefix + default_reason)
    assert index == 0  # equal prefix and queue scores; worker 11's KV is half used
    policy.on_routed(two_pods, index)
    policy.on_outcome(two_pods.request.request_id, 9.0, 1.0)
    assert (policy.aci.updates, policy.aci.offset_s) == (0, 0.0)


def test_lowest_predicted_p90_differs_from_cost_aware(two_pods):
    assert fitted().choose(two_pods) == (1, "lowest predicted P90: P90 500.0 ms + ACI offset 0.0 ms")
    assert CostAwarePolicy().choose(two_pods)[0] == 0


def test_outcomes_update_the_offset_against_the_decision_time_forecast(two_pods):
    policy = fitted()
    index, _ = policy.choose(two_pods)
    policy.on_routed(two_pods, index)
    policy.on_outcome(two_pods.request.request_id, 0.9, 2.0)  # 0.9 s > P90 0.5 s: a miss
    assert policy.aci.offset_s == pytest.approx(0.01 * (1 - 0.1))
    policy.on_outcome(two_pods.request.request_id, 0.9, 2.0)  # already scored: ignored
    assert policy.aci.updates == 1
    assert policy.choose(two_pods)[1] == "lowest predicted P90: P90 500.0 ms + ACI offset 9.0 ms"


@pytest.mark.parametrize(
    ("slo_s", "strategy", "expected"),
    [
        (4.0, "most", (1, "most headroom")),  # headroom 1.0 s (busy pod) vs 3.5 s (idle pod)
        (4.0, "least", (0, "least positive headroom")),
        (2.0, "least", (1, "least positive headroom")),  # only the idle pod has headroom
        (0.4, "most", (1, "no positive headroom: least negative")),  # −2.6 s vs −0.1 s
    ],
)
def test_headroom_to_a_ttft_slo(two_pods, slo_s, strategy, expected):
    index, reason = fitted(ttft_slo_s=slo_s, headroom_strategy=strategy).choose(two_pods)
    rule = reason.removesuffix(f": P90 {[3000.0, 500.0][index]:.1f} ms + ACI offset 0.0 ms")
    assert (index, rule) == expected


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError, match="ttft_slo_s = 0"):
        LlmdPredictedLatencyPolicy(ttft_slo_s=0)
    with pytest.raises(ValueError, match="headroom_strategy = 'max'"):
        LlmdPredictedLatencyPolicy(headroom_strategy="max")
