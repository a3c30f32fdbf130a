"""Tests for kvcost.routing.policies.dualmap (the ``dualmap`` anchor)."""

import pytest

from kvcost.routing.policies import ROUTER_POLICIES, make_policy
from kvcost.routing.policies.basic import CostAwarePolicy
from kvcost.routing.policies.dualmap import (
    DEFAULT_PREFIX_BLOCKS,
    DEFAULT_TTFT_SLO_S,
    DualMapPolicy,
    candidate_pair,
    prefix_key,
)

from .helpers import context, with_cache_and_ttft

#: Request blocks [1, 2, 3]: key (1, 2), whose pair among 3 candidates is (0, 2) (see the pair test).
HASHES = [1, 2, 3]


@pytest.fixture
def three(linear_step_model, make_snapshot):
    """``make(reusable, ttft_s)`` → context of a 3-block request over workers 10, 11, 12."""
    snapshots = [make_snapshot(10 + i) for i in range(3)]

    def make(reusable, ttft_s):
        return with_cache_and_ttft(context(linear_step_model, snapshots, HASHES), reusable, ttft_s)

    return make


def test_registered_with_defaults():
    assert ROUTER_POLICIES.get("dualmap") is DualMapPolicy
    policy = make_policy("dualmap")
    assert (policy.name, policy.ttft_slo_s, policy.prefix_blocks) == ("dualmap", DEFAULT_TTFT_SLO_S, 2)
    assert (DEFAULT_TTFT_SLO_S, DEFAULT_PREFIX_BLOCKS) == (5.0, 2)


def test_two_choice_hashing_is_deterministic_and_distinct():
    assert candidate_pair((1, 2), 3) == (0, 2)
    assert candidate_pair((1, 2), 4) == (0, 1)
    assert candidate_pair((1, 9), 3) == (1, 0)
    assert [candidate_pair((k,), 4) for k in range(4)] == [(2, 3), (0, 2), (0, 3), (0, 1)]
    assert candidate_pair((7,), 1) == (0, 0)
    assert all(a != b for a, b in (candidate_pair((k,), 4) for k in range(200)))
    with pytest.raises(ValueError, match="n = 0"):
        candidate_pair((1,), 0)


def test_the_key_is_the_leading_blocks_or_the_request_id(linear_step_model, make_snapshot):
    snapshots = [make_snapshot(10)]
    assert prefix_key(context(linear_step_model, snapshots, [5, 6, 7]), 2) == (5, 6)
    assert prefix_key(context(linear_step_model, snapshots, [], input_tokens=10), 2) == (-1, 0)


def test_holder_kept_up_to_the_slo_and_the_other_taken_just_above(three):
    # pair (0, 2); worker 10 holds 32 tokens of the prefix, worker 12 none
    policy = DualMapPolicy(ttft_slo_s=0.5)
    at_slo = three([32, 0, 0], [0.5, 0.1, 0.2])
    assert policy.choose(at_slo) == (
        0,
        "cache holder within the SLO; pair 10/12, predicted TTFT 500.0 ms, SLO 500 ms, reuse 32 tokens",
    )
    above = three([32, 0, 0], [0.5000001, 0.1, 0.2])
    assert policy.choose(above) == (
        2,
        "cache holder would break the SLO: the other; pair 10/12, predicted TTFT 200.0 ms, SLO 500 ms, reuse 0 tokens",
    )


def test_dualmap_and_cost_aware_differ(three):
    # the holder (worker 10) is within the SLO; worker 11, outside the pair, is predicted faster
    ctx = three([32, 0, 0], [0.3, 0.1, 0.2])
    assert DualMapPolicy().choose(ctx)[0] == 0
    assert CostAwarePolicy().choose(ctx)[0] == 1


def test_without_a_cache_holder_the_faster_of_the_pair(three):
    policy = DualMapPolicy()
    assert policy.decide(three([0, 0, 0], [0.3, 0.0, 0.2])).chosen == 2
    assert policy.decide(three([16, 0, 16], [0.3, 0.0, 0.3])).chosen == 0  # equal reuse, tie → first of the pair
    assert policy.decide(three([0, 64, 0], [0.3, 0.0, 0.2])).holder is None  # worker 11 is not in the pair


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError, match="ttft_slo_s = 0"):
        DualMapPolicy(ttft_slo_s=0)
    with pytest.raises(ValueError, match="prefix_blocks = 0"):
        DualMapPolicy(prefix_blocks=0)
