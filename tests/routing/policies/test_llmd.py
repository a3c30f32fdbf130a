"""Tests for kvcost.routing.policies.llmd (the ``llmd_default`` baseline)."""

import numpy as np
import pytest

from kvcost.core.composition import TermPredictions
from kvcost.core.types import DirectoryMatch, Namespace, RouteRequest
from kvcost.routing.policies import ROUTER_POLICIES, PolicyContext, make_policy
from kvcost.routing.policies.llmd import LlmdDefaultPolicy, queue_scores

BLOCK_TOKENS = 16


@pytest.fixture
def make_context(linear_step_model):
    """``make(snapshots, matched_blocks, n_hashes)`` → PolicyContext for a 100-token prompt."""

    def make(snapshots, matched_blocks, n_hashes=6):
        n = len(snapshots)
        request = RouteRequest(
            0, 0.0, 100, tuple(range(1, n_hashes + 1)), Namespace("m", block_size_tokens=BLOCK_TOKENS)
        )
        zeros = np.zeros(n)
        matches = tuple(
            DirectoryMatch(s.worker_id, b, "gpu" if b else "none", 0.0)
            for s, b in zip(snapshots, matched_blocks, strict=True)
        )
        return PolicyContext(
            request=request,
            snapshots=tuple(snapshots),
            reusable_tokens=np.array([b * BLOCK_TOKENS for b in matched_blocks], dtype=np.int64),
            predictions=TermPredictions(zeros, zeros, zeros, zeros, zeros),
            load_tokens=zeros,
            allowed=np.ones(n, dtype=bool),
            matches=matches,
            step_models={"linear-gpu": linear_step_model},
        )

    return make


def waiting(count):
    return tuple((10, 0) for _ in range(count))


def test_registered_under_its_name():
    assert ROUTER_POLICIES.get("llmd_default") is LlmdDefaultPolicy
    assert make_policy("llmd_default").name == "llmd_default"


def test_weighted_score_by_hand(make_snapshot, make_context):
    snapshots = [
        make_snapshot(10, waiting_prefill=waiting(3), kv_usage=0.5),
        make_snapshot(11, kv_usage=0.2),
        make_snapshot(12, waiting_prefill=waiting(1), kv_usage=0.0),
    ]
    ctx = make_context(snapshots, [6, 3, 0])
    scores = LlmdDefaultPolicy().scores(ctx)
    np.testing.assert_allclose(scores.prefix, [1.0, 0.5, 0.0])
    np.testing.assert_allclose(scores.queue, [0.0, 1.0, 2 / 3])  # (3 − q) / (3 − 0)
    np.testing.assert_allclose(scores.kv, [0.5, 0.8, 1.0])
    # 3 + 0 + 1, 1.5 + 2 + 1.6, 0 + 4/3 + 2
    np.testing.assert_allclose(scores.total, [4.0, 5.1, 10 / 3])
    assert LlmdDefaultPolicy().choose(ctx) == (
        1,
        "max score 5.100 = 3×prefix 0.500 + 2×queue 1.000 + 2×kv 0.800; matched 3/6 blocks, 0 waiting, KV usage 0.20",
    )


def test_equal_queues_all_score_one(make_snapshot, make_context):
    np.testing.assert_array_equal(queue_scores(np.array([2, 2, 2])), [1.0, 1.0, 1.0])
    snapshots = [make_snapshot(10 + i, waiting_prefill=waiting(2), kv_usage=u) for i, u in enumerate((0.5, 0.0, 0.1))]
    scores = LlmdDefaultPolicy().scores(make_context(snapshots, [3, 0, 1]))
    np.testing.assert_allclose(scores.queue, [1.0, 1.0, 1.0])
    # 1.5 + 2 + 1, 0 + 2 + 2, 0.5 + 2 + 1.8
    np.testing.assert_allclose(scores.total, [4.5, 4.0, 4.3])


def test_prompt_without_full_block_has_no_prefix_score(make_snapshot, make_context):
    ctx = make_context([make_snapshot(10), make_snapshot(11)], [0, 0], n_hashes=0)
    np.testing.assert_array_equal(LlmdDefaultPolicy().scores(ctx).prefix, [0.0, 0.0])


def test_ties_are_broken_at_random_with_a_fixed_seed(make_snapshot, make_context):
    snapshots = [make_snapshot(10), make_snapshot(11), make_snapshot(12, kv_usage=0.5)]
    ctx = make_context(snapshots, [0, 0, 0])
    first, second = LlmdDefaultPolicy(), LlmdDefaultPolicy()
    picks = [first.choose(ctx)[0] for _ in range(40)]
    assert picks == [second.choose(ctx)[0] for _ in range(40)]
    assert set(picks) == {0, 1}  # pod 12 scores 1 lower (KV) and never wins
    assert first.choose(ctx)[1].startswith("max score (random among 2 tied) 4.000 = ")


def test_custom_weights_change_the_winner(make_snapshot, make_context):
    snapshots = [make_snapshot(10, waiting_prefill=waiting(3)), make_snapshot(11)]
    ctx = make_context(snapshots, [6, 0])
    assert LlmdDefaultPolicy().choose(ctx)[0] == 0  # 3 + 0 + 2 vs 0 + 2 + 2
    assert LlmdDefaultPolicy(prefix_cache_weight=1.0).choose(ctx)[0] == 1  # 1 + 0 + 2 vs 0 + 2 + 2


def test_negative_weight_is_refused():
    with pytest.raises(ValueError, match="queue_weight = -1"):
        LlmdDefaultPolicy(queue_weight=-1)
