"""Tests for kvcost.routing.policies.aibrix (the AIBrix ``prefix-cache`` baseline)."""

import pytest

from kvcost.routing.policies import ROUTER_POLICIES, make_policy
from kvcost.routing.policies.aibrix import AIBrixPrefixCachePolicy, PrefixHashTable

from .helpers import context

PROMPT = (1, 2, 3, 4)


def test_registered_and_defaults():
    assert ROUTER_POLICIES.get("aibrix_prefix_cache") is AIBrixPrefixCachePolicy
    policy = make_policy("aibrix_prefix_cache")
    assert policy.name == "aibrix_prefix_cache"
    assert (policy.imbalance_abs_count, policy.standard_deviation_factor) == (16, 2.0)
    assert (policy.block_ttl_s, policy.index_capacity_tokens) == (1200.0, 6_400_000)


def test_imbalance_goes_to_least_request_despite_cache(linear_step_model, make_snapshot):
    policy = AIBrixPrefixCachePolicy()
    snapshots = [
        make_snapshot(10, running_requests=20),
        make_snapshot(11, running_requests=1, waiting_prefill=((64, 0),)),  # 2 requests in flight
        make_snapshot(12, running_requests=5),
        make_snapshot(13, running_requests=3),
    ]
    policy.on_routed(context(linear_step_model, snapshots, PROMPT), 0)
    ctx = context(linear_step_model, snapshots, PROMPT)
    assert policy.choose(ctx) == (1, "imbalanced: max 20 − min 2 running > 16 → least-request worker 11 (2 running)")


def test_spread_equal_to_threshold_is_balanced(linear_step_model, workers):
    policy = AIBrixPrefixCachePolicy()
    snapshots = workers(18, 2, 5, 3)  # 18 − 2 = 16, not > 16; mean 7, sample σ = sqrt(166 / 3)
    policy.on_routed(context(linear_step_model, snapshots, PROMPT), 0)
    assert policy.choose(context(linear_step_model, snapshots, PROMPT)) == (
        0,
        "prefix match 100% → worker 10 (18 running ≤ mean 7.0 + 2σ 7.4 = 21.9)",
    )


def test_best_match_percent_then_fewest_requests(linear_step_model, workers):
    policy = AIBrixPrefixCachePolicy()
    snapshots = workers(0, 3, 2, 1)
    policy.on_routed(context(linear_step_model, snapshots, PROMPT[:2]), 0)  # 50 %
    policy.on_routed(context(linear_step_model, snapshots, PROMPT), 1)  # 100 %, 3 running
    policy.on_routed(context(linear_step_model, snapshots, PROMPT), 2)  # 100 %, 2 running
    # mean 1.5, sample σ = sqrt(5 / 3) ≈ 1.29 → limit 4.08: everyone passes, the order decides.
    assert policy.choose(context(linear_step_model, snapshots, PROMPT)) == (
        2,
        "prefix match 100% → worker 12 (2 running ≤ mean 1.5 + 2σ 1.3 = 4.1)",
    )


def test_match_percent_is_integer_floor_of_full_blocks(linear_step_model, workers):
    policy = AIBrixPrefixCachePolicy()
    snapshots = workers(0, 0)
    policy.on_routed(context(linear_step_model, snapshots, [1]), 1)
    assert policy.choose(context(linear_step_model, snapshots, [1, 2, 3])) == (
        1,
        "prefix match 33% → worker 11 (0 running ≤ mean 0.0 + 2σ 0.0 = 0.0)",
    )


def test_sigma_filter_excludes_overloaded_best_match(linear_step_model, workers):
    policy = AIBrixPrefixCachePolicy()
    snapshots = workers(12, 0, 1, 1, 1, 1)  # mean 8/3, sample σ ≈ 4.59 → limit ≈ 11.85 < 12
    policy.on_routed(context(linear_step_model, snapshots, PROMPT), 0)  # 100 % on the hot pod
    policy.on_routed(context(linear_step_model, snapshots, PROMPT[:2]), 3)  # 50 %
    assert policy.choose(context(linear_step_model, snapshots, PROMPT)) == (
        3,
        "prefix match 50% → worker 13 (1 running ≤ mean 2.7 + 2σ 4.6 = 11.8); 1 better-matched pod(s) over the limit",
    )


def test_all_matched_pods_over_limit_fall_back_to_least_request(linear_step_model, workers):
    policy = AIBrixPrefixCachePolicy()
    snapshots = workers(12, 0, 1, 1, 1, 1)
    policy.on_routed(context(linear_step_model, snapshots, PROMPT), 0)
    assert policy.choose(context(linear_step_model, snapshots, PROMPT)) == (
        1,
        "prefix match skipped: 1 matched pod(s) over mean 2.7 + 2σ 4.6 = 11.8 → least-request worker 11 (0 running)",
    )


def test_no_match_goes_to_least_request(linear_step_model, workers):
    ctx = context(linear_step_model, workers(3, 1, 2, 2), PROMPT)
    assert AIBrixPrefixCachePolicy().choose(ctx) == (1, "no prefix match → least-request worker 11 (1 running)")


def test_blocks_expire_after_ttl(linear_step_model, workers):
    policy = AIBrixPrefixCachePolicy()
    snapshots = workers(0, 1, 1)
    policy.on_routed(context(linear_step_model, snapshots, PROMPT, now_s=0.0), 2)
    hit = "prefix match 100% → worker 12 (1 running ≤ mean 0.7 + 2σ 0.6 = 1.8)"
    assert policy.choose(context(linear_step_model, snapshots, PROMPT, now_s=1200.0)) == (2, hit)
    assert policy.choose(context(linear_step_model, snapshots, PROMPT, now_s=1200.5)) == (
        0,
        "no prefix match → least-request worker 10 (0 running)",
    )
    assert len(policy.index) == 0


def test_adding_a_block_for_any_pod_refreshes_it_for_all(linear_step_model, workers):
    policy = AIBrixPrefixCachePolicy()
    snapshots = workers(0, 1, 1)
    policy.on_routed(context(linear_step_model, snapshots, PROMPT, now_s=0.0), 2)
    policy.on_routed(context(linear_step_model, snapshots, PROMPT, now_s=600.0), 1)
    policy.choose(context(linear_step_model, snapshots, PROMPT, now_s=1500.0))  # sweeps nothing: last put at 600
    assert policy.index.match(PROMPT, [10, 11, 12]) == [0, 4, 4]


def test_hash_table_evicts_least_recently_put_block_over_capacity():
    table = PrefixHashTable(capacity_blocks=3, ttl_s=60.0)
    table.add([1, 2, 3], worker_id=7, now_s=0.0)
    table.add([4], worker_id=8, now_s=1.0)  # evicts block 1, the root of 7's chain
    assert len(table) == 3
    assert table.match([1, 2, 3], [7]) == [0]
    assert table.match([2, 3], [7, 8]) == [2, 0]


def test_ties_broken_by_seeded_generator(linear_step_model, workers):
    def choices(seed):
        policy = AIBrixPrefixCachePolicy(seed=seed)
        snapshots = workers(1, 1, 1, 1)
        for index in (0, 2, 3):
            policy.on_routed(context(linear_step_model, snapshots, PROMPT), index)
        return [policy.choose(context(linear_step_model, snapshots, PROMPT))[0] for _ in range(20)]

    first = choices(0)
    assert set(first) <= {0, 2, 3} and len(set(first)) > 1
    assert first == choices(0)


def test_same_inputs_same_choices(linear_step_model, workers):
    def run():
        policy = make_policy("aibrix_prefix_cache")
        out = []
        for step, (hashes, running) in enumerate([((1, 2, 3), (0, 0)), ((1, 2, 4), (1, 0)), ((7, 8), (1, 1))]):
            ctx = context(linear_step_model, workers(*running), hashes, now_s=float(step))
            out.append(policy.choose(ctx))
            policy.on_routed(ctx, out[-1][0])
        return out

    assert run() == run()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"imbalance_abs_count": -1}, "imbalance_abs_count = -1, expected ≥ 0"),
        ({"block_ttl_s": 0.0}, "block_ttl_s = 0.0, expected > 0"),
        ({"index_capacity_tokens": 0}, "index_capacity_tokens = 0, expected ≥ 1"),
    ],
)
def test_rejects_bad_settings(kwargs, message):
    with pytest.raises(ValueError) as err:
        AIBrixPrefixCachePolicy(**kwargs)
    assert str(err.value) == message
