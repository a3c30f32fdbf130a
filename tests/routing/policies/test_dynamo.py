"""Tests for kvcost.routing.policies.dynamo (the ``dynamo_kv`` baseline)."""

import numpy as np
import pytest

from kvcost.core.composition import TermPredictions
from kvcost.core.types import DirectoryMatch, Namespace, RouteRequest, reusable_tokens_for
from kvcost.routing.policies import ROUTER_POLICIES, PolicyContext, make_policy
from kvcost.routing.policies.dynamo import DynamoKvPolicy, active_blocks, softmax_probabilities

BLOCK_TOKENS = 16


@pytest.fixture
def make_context(linear_step_model):
    """``make(snapshots, matches, input_tokens)`` → PolicyContext; block_hashes = the prompt's full blocks."""

    def make(snapshots, matches, input_tokens=100, n_hashes=None):
        n = len(snapshots)
        hashes = tuple(range(1, (input_tokens // BLOCK_TOKENS if n_hashes is None else n_hashes) + 1))
        request = RouteRequest(0, 0.0, input_tokens, hashes, Namespace("m", block_size_tokens=BLOCK_TOKENS))
        zeros = np.zeros(n)
        return PolicyContext(
            request=request,
            snapshots=tuple(snapshots),
            reusable_tokens=np.array(
                [reusable_tokens_for(m.reusable_blocks, BLOCK_TOKENS, input_tokens) for m in matches], dtype=np.int64
            ),
            predictions=TermPredictions(zeros, zeros, zeros, zeros, zeros),
            load_tokens=zeros,
            allowed=np.ones(n, dtype=bool),
            matches=tuple(matches),
            step_models={"linear-gpu": linear_step_model},
        )

    return make


def match(worker_id, blocks, tier):
    return DirectoryMatch(worker_id, blocks, tier if blocks else "none", 0.0)


@pytest.fixture
def three_workers(make_snapshot, make_context):
    """100-token prompt (6.25 blocks, 7 rounded up), three workers with different loads and tiers."""
    snapshots = [
        make_snapshot(10),  # idle, prefix on GPU
        make_snapshot(11, waiting_prefill=((160, 0),)),  # 10 blocks queued, prefix on CPU
        make_snapshot(12, running_requests=2, decode_context_tokens=330),  # 21 decode blocks, prefix on disk
    ]
    matches = [match(10, 6, "gpu"), match(11, 4, "cpu"), match(12, 6, "disk")]
    return make_context(snapshots, matches)


def test_registered_under_its_name():
    assert ROUTER_POLICIES.get("dynamo_kv") is DynamoKvPolicy
    assert make_policy("dynamo_kv").name == "dynamo_kv"


def test_cost_by_hand_with_tier_weights(three_workers):
    costs = DynamoKvPolicy().costs(three_workers)
    # raw prefill = (active prefill tokens + 100) / 16
    np.testing.assert_allclose(costs.raw_prefill_blocks, [6.25, 16.25, 6.25])
    # credit = 6 GPU × 1.0, 4 CPU × 0.75, 6 disk × 0.25
    np.testing.assert_allclose(costs.overlap_credit_blocks, [6.0, 3.0, 1.5])
    # decode = active blocks + ceil(100 / 16) = 7: 0, ceil(160/16) = 10, ceil(330/16) = 21
    np.testing.assert_allclose(costs.decode_blocks, [7.0, 17.0, 28.0])
    # 0.25 + 7, 13.25 + 17, 4.75 + 28
    np.testing.assert_allclose(costs.cost_blocks, [7.25, 30.25, 32.75])


def test_lowest_cost_wins_at_temperature_zero(three_workers):
    assert DynamoKvPolicy().choose(three_workers) == (
        0,
        "lowest cost 7.25 blocks = 1 × max(6.25 − 6.00, 0) + 7; overlap 6 gpu blocks",
    )


def test_prefill_load_scale_and_credit_weights_are_used(three_workers):
    policy = DynamoKvPolicy(prefill_load_scale=2.0, host_cache_hit_weight=0.5, disk_cache_hit_weight=1.0)
    costs = policy.costs(three_workers)
    np.testing.assert_allclose(costs.overlap_credit_blocks, [6.0, 2.0, 6.0])
    # 2 × 0.25 + 7, 2 × 14.25 + 17, 2 × 0.25 + 28
    np.testing.assert_allclose(costs.cost_blocks, [7.5, 45.5, 28.5])


def test_remote_tier_gets_no_credit_by_default(make_snapshot, make_context):
    ctx = make_context([make_snapshot(10)], [match(10, 6, "remote")])
    assert DynamoKvPolicy().costs(ctx).overlap_credit_blocks[0] == 0.0
    assert DynamoKvPolicy(shared_cache_multiplier=0.5).costs(ctx).overlap_credit_blocks[0] == 3.0


def test_prefill_term_is_clamped_at_zero(make_snapshot, make_context):
    # Hand-made state: a match of 8 blocks against a 100-token prompt (6.25 blocks of prefill).
    ctx = make_context([make_snapshot(10)], [match(10, 8, "gpu")], n_hashes=8)
    costs = DynamoKvPolicy().costs(ctx)
    assert costs.cost_blocks[0] == 7.0  # max(6.25 − 8, 0) + 7


def test_active_blocks_count_waiting_and_decoding_requests(make_snapshot):
    snapshot = make_snapshot(0, waiting_prefill=((20, 0), (4, 28)), decode_context_tokens=17)
    # ceil(20/16) + ceil(32/16) + ceil(17/16)
    assert active_blocks(snapshot, 16) == 2 + 2 + 2


def test_ties_are_broken_at_random_with_a_fixed_seed(make_snapshot, make_context):
    snapshots = [make_snapshot(10), make_snapshot(11), make_snapshot(12, waiting_prefill=((16, 0),))]
    ctx = make_context(snapshots, [match(w, 0, "none") for w in (10, 11, 12)])
    first, second = DynamoKvPolicy(), DynamoKvPolicy()
    picks = [first.choose(ctx)[0] for _ in range(40)]
    assert picks == [second.choose(ctx)[0] for _ in range(40)]
    assert set(picks) == {0, 1}  # worker 12 costs 2 blocks more and never wins
    assert first.choose(ctx)[1].startswith("lowest cost (random among 2 tied) 13.25 blocks")


def test_softmax_normalises_costs_by_their_range():
    # p_i ∝ exp(−(c_i − 7.25) / (25.5 × 0.5))
    expected = np.exp([0.0, -23.0 / 12.75, -2.0])
    np.testing.assert_allclose(
        softmax_probabilities(np.array([7.25, 30.25, 32.75]), 0.5), expected / expected.sum(), rtol=1e-12
    )
    np.testing.assert_allclose(softmax_probabilities(np.array([4.0, 4.0]), 0.5), [0.5, 0.5])
    with pytest.raises(ValueError, match="temperature = 0"):
        softmax_probabilities(np.array([1.0]), 0.0)


def test_sampling_is_seeded_and_prefers_low_cost(three_workers):
    draws = [DynamoKvPolicy(router_temperature=0.5, seed=s) for s in (0, 0, 1)]
    sequences = [[policy.choose(three_workers)[0] for _ in range(1000)] for policy in draws]
    assert sequences[0] == sequences[1]
    assert sequences[0] != sequences[2]
    counts = np.bincount(sequences[0], minlength=3)
    # expected shares 0.769 / 0.127 / 0.104
    assert counts[0] > 700 and counts[1] > 80 and counts[2] > 60


def test_sampled_reason_states_probability(three_workers):
    index, reason = DynamoKvPolicy(router_temperature=0.5).choose(three_workers)
    expected_p = softmax_probabilities(np.array([7.25, 30.25, 32.75]), 0.5)[index]
    assert reason.startswith(f"sampled at temperature 0.5 (p={expected_p:.2f}) ")


def test_invalid_settings_are_refused():
    with pytest.raises(ValueError, match="overlap_score_credit = 1.5"):
        DynamoKvPolicy(overlap_score_credit=1.5)
    with pytest.raises(ValueError, match="router_temperature = -1"):
        DynamoKvPolicy(router_temperature=-1)


def test_missing_matches_are_an_error(make_snapshot, make_context):
    ctx = make_context([make_snapshot(10)], [])
    with pytest.raises(ValueError, match="one directory match per candidate"):
        DynamoKvPolicy().choose(ctx)
