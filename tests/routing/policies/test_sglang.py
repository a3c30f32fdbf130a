"""Tests for kvcost.routing.policies.sglang (the SGLang router ``cache_aware`` baseline)."""

import pytest

from kvcost.routing.policies import ROUTER_POLICIES, make_policy
from kvcost.routing.policies.sglang import DEFAULT_MAX_TREE_SIZE_TOKENS, SGLangCacheAwarePolicy

from .helpers import context


def test_registered_and_defaults():
    assert ROUTER_POLICIES.get("sglang_cache_aware") is SGLangCacheAwarePolicy
    policy = make_policy("sglang_cache_aware")
    assert policy.name == "sglang_cache_aware"
    assert (policy.cache_threshold, policy.balance_abs_threshold, policy.balance_rel_threshold) == (0.3, 64, 1.5)
    assert (policy.eviction_interval_s, policy.low_match_target) == (60.0, "min_load")
    assert policy.max_tree_size_tokens == DEFAULT_MAX_TREE_SIZE_TOKENS == 2**24  # 2**26 characters / 4


def test_imbalanced_goes_to_shortest_queue_despite_cache(linear_step_model, make_snapshot):
    policy = SGLangCacheAwarePolicy()
    snapshots = [
        make_snapshot(10, running_requests=80),
        make_snapshot(11, running_requests=1, waiting_prefill=((100, 0), (50, 0))),  # load 3
        make_snapshot(12, running_requests=10),
    ]
    policy.on_routed(context(linear_step_model, snapshots, [1, 2, 3, 4]), 0)  # worker 10 holds the prefix
    ctx = context(linear_step_model, snapshots, [1, 2, 3, 4])
    assert policy.choose(ctx) == (
        1,
        "imbalanced: max 80 − min 3 > 64 and 80 > 1.5 × 3 → shortest queue worker 11 (load 3)",
    )
    policy.on_routed(ctx, 1)  # the tree learns the imbalanced choice too
    assert policy.tree.match([1, 2, 3, 4], [10, 11, 12]) == [4, 4, 0]


@pytest.mark.parametrize(
    ("running", "reason"),
    [
        ((300, 230), "low match: matched 0 of 64 tokens = 0.00 ≤ 0.3 → least-loaded worker 11 (load 230)"),
        ((60, 0), "low match: matched 0 of 64 tokens = 0.00 ≤ 0.3 → least-loaded worker 11 (load 0)"),
    ],
    ids=["abs-only", "rel-only"],
)
def test_imbalance_needs_both_thresholds(linear_step_model, workers, running, reason):
    # 300 − 230 = 70 > 64 but 300 ≤ 1.5 × 230; 60 > 1.5 × 0 but 60 − 0 ≤ 64: balanced both times.
    ctx = context(linear_step_model, workers(*running), [1, 2, 3, 4])
    assert SGLangCacheAwarePolicy().choose(ctx) == (1, reason)


def test_balanced_match_above_threshold_goes_to_best_match(linear_step_model, workers):
    policy = SGLangCacheAwarePolicy()
    snapshots = workers(0, 0, 40)
    policy.on_routed(context(linear_step_model, snapshots, [1, 2, 3, 4]), 2)
    ctx = context(linear_step_model, snapshots, [1, 2, 3, 9])
    assert policy.choose(ctx) == (2, "cache hit: matched 48 of 64 tokens = 0.75 > 0.3 → best-match worker 12")


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("min_load", (0, "low match: matched 16 of 64 tokens = 0.25 ≤ 0.3 → least-loaded worker 10 (load 1)")),
        ("smallest_tree", (1, "low match: matched 16 of 64 tokens = 0.25 ≤ 0.3 → smallest-tree worker 11 (0 tokens)")),
    ],
)
def test_balanced_match_below_threshold(linear_step_model, workers, target, expected):
    policy = SGLangCacheAwarePolicy(low_match_target=target)
    snapshots = workers(1, 5, 3)
    policy.on_routed(context(linear_step_model, snapshots, [1, 2, 3, 4]), 0)  # worker 10: 64 tokens
    policy.on_routed(context(linear_step_model, snapshots, [20, 21]), 2)  # worker 12: 32 tokens
    assert policy.choose(context(linear_step_model, snapshots, [1, 7, 8, 9])) == expected


def test_match_rate_equal_to_threshold_is_a_miss(linear_step_model, workers):
    policy = SGLangCacheAwarePolicy()
    snapshots = workers(4, 1)
    policy.on_routed(context(linear_step_model, snapshots, [1, 2, 3]), 0)
    ctx = context(linear_step_model, snapshots, [1, 2, 3, *range(30, 37)])  # 48 of 160 tokens
    assert policy.choose(ctx) == (
        1,
        "low match: matched 48 of 160 tokens = 0.30 ≤ 0.3 → least-loaded worker 11 (load 1)",
    )


def test_match_capped_at_input_tokens(linear_step_model, workers):
    policy = SGLangCacheAwarePolicy()
    snapshots = workers(0, 0)
    policy.on_routed(context(linear_step_model, snapshots, [1, 2]), 1)
    ctx = context(linear_step_model, snapshots, [1, 2], input_tokens=40)  # 2 full blocks + 8 tokens
    assert policy.choose(ctx) == (1, "cache hit: matched 32 of 40 tokens = 0.80 > 0.3 → best-match worker 11")


def test_lru_trim_every_interval_keeps_root_blocks(linear_step_model, workers):
    policy = SGLangCacheAwarePolicy(max_tree_size_tokens=32)  # 2 blocks per worker
    prompt = list(range(1, 11))  # 10 blocks, 160 tokens
    first = context(linear_step_model, workers(0, 2), prompt, now_s=0.0)  # starts the eviction clock
    assert policy.choose(first) == (
        0,
        "low match: matched 0 of 160 tokens = 0.00 ≤ 0.3 → least-loaded worker 10 (load 0)",
    )
    policy.on_routed(first, 0)

    before = context(linear_step_model, workers(2, 0), prompt, now_s=59.0)
    assert policy.choose(before) == (0, "cache hit: matched 160 of 160 tokens = 1.00 > 0.3 → best-match worker 10")
    assert policy.tree.size_blocks(10) == 10

    after = context(linear_step_model, workers(2, 0), prompt, now_s=60.0)
    assert policy.choose(after) == (
        1,
        "low match: matched 32 of 160 tokens = 0.20 ≤ 0.3 → least-loaded worker 11 (load 0)",
    )
    assert policy.tree.size_blocks(10) == 2
    root = context(linear_step_model, workers(2, 0), [1, 2], now_s=61.0)  # the leaf blocks went first
    assert policy.choose(root) == (0, "cache hit: matched 32 of 32 tokens = 1.00 > 0.3 → best-match worker 10")


def test_trim_ticks_are_periodic(linear_step_model, workers):
    policy = SGLangCacheAwarePolicy(max_tree_size_tokens=16)
    policy.choose(context(linear_step_model, workers(0), [1], now_s=0.0))  # clock starts: ticks at 60, 120, ...
    policy.on_routed(context(linear_step_model, workers(0), [1, 2, 3], now_s=0.0), 0)
    policy.choose(context(linear_step_model, workers(0), [9], now_s=130.0))  # ticks 60 and 120 collapse into one
    assert policy.tree.size_blocks(10) == 1
    policy.on_routed(context(linear_step_model, workers(0), [4, 5, 6], now_s=130.0), 0)
    policy.choose(context(linear_step_model, workers(0), [9], now_s=179.0))  # next tick is 180
    assert policy.tree.size_blocks(10) == 4
    policy.choose(context(linear_step_model, workers(0), [9], now_s=180.0))
    assert policy.tree.size_blocks(10) == 1


def test_same_inputs_same_choices(linear_step_model, workers):
    def run():
        policy = make_policy("sglang_cache_aware")
        out = []
        for step, (hashes, running) in enumerate([([1, 2, 3], (0, 0)), ([1, 2, 4], (1, 0)), ([7, 8], (1, 1))]):
            ctx = context(linear_step_model, workers(*running), hashes, now_s=float(step))
            out.append(policy.choose(ctx))
            policy.on_routed(ctx, out[-1][0])
        return out

    assert run() == run()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cache_threshold": 1.5}, "cache_threshold = 1.5, expected a value in [0, 1]"),
        ({"eviction_interval_s": 0}, "eviction_interval_s = 0, expected > 0"),
        ({"low_match_target": "random"}, "low_match_target = 'random', expected one of min_load, smallest_tree"),
    ],
)
def test_rejects_bad_settings(kwargs, message):
    with pytest.raises(ValueError) as err:
        SGLangCacheAwarePolicy(**kwargs)
    assert str(err.value) == message
