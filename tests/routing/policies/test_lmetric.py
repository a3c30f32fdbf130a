"""Tests for kvcost.routing.policies.lmetric (the ``lmetric`` anchor)."""

import numpy as np

from kvcost.routing.policies import ROUTER_POLICIES, make_policy
from kvcost.routing.policies.basic import CostAwarePolicy
from kvcost.routing.policies.lmetric import LMetricPolicy, lmetric_scores

from .helpers import context, with_cache_and_ttft


def _ctx(linear_step_model, snapshots, reusable, ttft_s=None):
    """A 100-token request of 6 blocks with ``reusable`` tokens and predicted TTFTs per candidate."""
    ctx = context(linear_step_model, snapshots, [1, 2, 3, 4, 5, 6], input_tokens=100)
    return with_cache_and_ttft(ctx, reusable, ttft_s)


def test_registered_under_its_name():
    assert ROUTER_POLICIES.get("lmetric") is LMetricPolicy
    assert make_policy("lmetric").name == "lmetric"


def test_metric_by_hand(linear_step_model, make_snapshot):
    snapshots = [make_snapshot(10, running_requests=3), make_snapshot(11), make_snapshot(12, running_requests=1)]
    scores = lmetric_scores(_ctx(linear_step_model, snapshots, [64, 0, 50]))
    np.testing.assert_array_equal(scores.uncached_tokens, [36, 100, 50])
    np.testing.assert_array_equal(scores.decode_batch, [3, 0, 1])
    np.testing.assert_array_equal(scores.metric, [144.0, 100.0, 100.0])  # 36 × 4, 100 × 1, 50 × 2


def test_lmetric_and_cost_aware_differ(linear_step_model, make_snapshot):
    # worker 10 holds 64 of 100 tokens but decodes 3 requests: 36 × 4 = 144 > 100 × 1 on the idle worker 11;
    # the cost model predicts worker 10 faster (0.1 s vs 0.2 s), so cost_aware keeps the cache hit.
    snapshots = [make_snapshot(10, running_requests=3), make_snapshot(11)]
    ctx = _ctx(linear_step_model, snapshots, [64, 0], ttft_s=[0.1, 0.2])
    assert LMetricPolicy().choose(ctx) == (1, "min LMetric 100 = 100 uncached tokens × (0 decoding + 1)")
    assert CostAwarePolicy().choose(ctx)[0] == 0


def test_ties_are_broken_at_random_with_a_fixed_seed(linear_step_model, make_snapshot):
    snapshots = [make_snapshot(10, running_requests=3), make_snapshot(11), make_snapshot(12, running_requests=1)]
    ctx = _ctx(linear_step_model, snapshots, [64, 0, 50])  # 144, 100, 100
    first, second = LMetricPolicy(seed=1), LMetricPolicy(seed=1)
    picks = [first.choose(ctx)[0] for _ in range(30)]
    assert picks == [second.choose(ctx)[0] for _ in range(30)]
    assert set(picks) == {1, 2}
    assert first.choose(ctx)[1].startswith("min LMetric (random among 2 tied) 100 = ")
