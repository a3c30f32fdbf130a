"""Tests for kvcost.routing.policies.preble (the Preble E2 baseline).

Times follow the ``linear_step_model`` fixture: prefill of n new tokens after c cached
ones (n ≤ 8192) takes ``n µs + n (c + (n + 1) / 2) ps + 1 ms``; a decode step of k
tokens reading x KV tokens takes ``k µs + x µs + 1 ms``. An 8-block (128-token)
request routed to an idle GPU therefore adds 1.128008 ms of prefill + 343 × 1.129 ms
of decode = 388.375 ms of windowed load.
"""

import pytest

from kvcost.routing.policies import ROUTER_POLICIES
from kvcost.routing.policies.preble import DEFAULT_EXPECTED_OUTPUT_TOKENS, PrebleE2Policy

from .helpers import context

PROMPT = tuple(range(1, 9))  # 8 blocks, 128 tokens
LOAD_128_S = 1.128008256e-3 + 343 * 1.129e-3  # one 128-token request routed to an idle GPU


def unrelated(start):
    """An 8-block prompt sharing nothing with the others."""
    return tuple(range(start, start + 8))


@pytest.fixture
def gpus(make_snapshot):
    """Idle snapshots of GPUs 10, 11, ... (``n`` of them); ``overrides`` maps a worker id to snapshot fields."""

    def make(n, overrides=None):
        overrides = overrides or {}
        return [make_snapshot(10 + i, **overrides.get(10 + i, {})) for i in range(n)]

    return make


def test_registered_and_defaults():
    assert ROUTER_POLICIES.get("preble_e2") is PrebleE2Policy
    policy = PrebleE2Policy()
    assert policy.name == "preble_e2"
    assert (policy.window_s, policy.expected_output_tokens, policy.kv_capacity_blocks) == (180.0, 343, None)
    assert DEFAULT_EXPECTED_OUTPUT_TOKENS == 343


def test_work_of_a_routed_request(linear_step_model, gpus):
    policy = PrebleE2Policy(kv_capacity_blocks=100)
    snapshots = gpus(2)
    policy.on_routed(context(linear_step_model, snapshots, PROMPT), 1)
    costs = policy.costs(context(linear_step_model, snapshots, unrelated(100)))
    assert costs.load_s.tolist() == pytest.approx([0.0, LOAD_128_S], rel=1e-12)
    assert costs.prefill_s.tolist() == pytest.approx([1.128008256e-3] * 2, rel=1e-12)


def test_exploit_when_cached_exceeds_missed_then_explore(linear_step_model, gpus):
    policy = PrebleE2Policy(kv_capacity_blocks=100)
    snapshots = gpus(3)
    policy.on_routed(context(linear_step_model, snapshots, PROMPT), 1)
    policy.on_routed(context(linear_step_model, snapshots, PROMPT), 2)
    policy.on_routed(context(linear_step_model, snapshots, unrelated(100)), 2)  # GPU 12 is busier than 11

    # 16 missed < 128 cached: stay on a holder (the cheaper of 11 and 12) although GPU 10 is idle.
    exploit = context(linear_step_model, snapshots, (*PROMPT, 9), now_s=1.0)
    assert policy.choose(exploit) == (
        1,
        "exploit: missed 16 < cached 128 tokens; lowest cost among 2 holder(s) → worker 11: "
        "389.391 ms = load 388.375 + prefill 1.016 + eviction 0.000",
    )
    # 128 missed ≥ 32 cached: explore every GPU; the idle one is cheapest.
    explore = context(linear_step_model, snapshots, (1, 2, *range(50, 58)), now_s=2.0)
    assert policy.choose(explore) == (
        0,
        "explore: missed 128 ≥ cached 32 tokens; lowest cost among 3 → worker 10: "
        "1.160 ms = load 0.000 + prefill 1.160 + eviction 0.000",
    )


def test_equal_cached_and_missed_explores(linear_step_model, gpus):
    policy = PrebleE2Policy(kv_capacity_blocks=100)
    snapshots = gpus(2)
    policy.on_routed(context(linear_step_model, snapshots, PROMPT[:4]), 1)
    index, reason = policy.choose(context(linear_step_model, snapshots, PROMPT))  # 64 cached, 64 missed
    assert (index, reason.split(";")[0]) == (0, "explore: missed 64 ≥ cached 64 tokens")


def test_window_expiry_changes_the_choice(linear_step_model, gpus):
    policy = PrebleE2Policy(kv_capacity_blocks=100)
    snapshots = gpus(2)
    policy.on_routed(context(linear_step_model, snapshots, unrelated(100), now_s=0.0), 0)
    policy.on_routed(context(linear_step_model, snapshots, unrelated(200), now_s=0.0), 0)
    policy.on_routed(context(linear_step_model, snapshots, unrelated(300), now_s=100.0), 1)
    probe = unrelated(400)

    at_180 = policy.choose(context(linear_step_model, snapshots, probe, now_s=180.0))  # window [0, 180]: all kept
    assert at_180 == (
        1,
        "explore: missed 128 ≥ cached 0 tokens; lowest cost among 2 → worker 11: "
        "389.503 ms = load 388.375 + prefill 1.128 + eviction 0.000",
    )
    at_181 = policy.choose(context(linear_step_model, snapshots, probe, now_s=181.0))  # the two at t = 0 are out
    assert at_181 == (
        0,
        "explore: missed 128 ≥ cached 0 tokens; lowest cost among 2 → worker 10: "
        "1.128 ms = load 0.000 + prefill 1.128 + eviction 0.000",
    )


def hot_history(policy, step_model, snapshots):
    """Each GPU serves its own prompt twice: equal windowed loads, 8 hits on 8 remembered blocks each.

    Load per GPU: 388.375 ms (first, all missed) + 343 × 1.129 ms = 387.247 ms (second, all cached) = 775.622 ms.
    """
    for now_s in (0.0, 1.0):
        policy.on_routed(context(step_model, snapshots, PROMPT, now_s=now_s), 0)
        policy.on_routed(context(step_model, snapshots, unrelated(100), now_s=now_s), 1)


def test_eviction_cost_tips_the_choice(linear_step_model, gpus):
    policy = PrebleE2Policy(kv_capacity_blocks=100)
    hot_history(policy, linear_step_model, gpus(2))
    probe = unrelated(500)

    free = context(linear_step_model, gpus(2), probe, now_s=2.0)
    index, reason = policy.choose(free)
    assert index == 0 and reason.endswith("eviction 0.000")  # a tie, broken by index

    # GPU 10 is full (50 used + 50 idle cached of 100 blocks): the 8 new blocks evict 8 hot ones.
    full = context(linear_step_model, gpus(2, {10: {"kv_usage": 0.5, "idle_cached_blocks": 50}}), probe, now_s=2.0)
    costs = policy.costs(full)
    assert costs.eviction_s.tolist() == pytest.approx([1.128008256e-3, 0.0], rel=1e-12)  # prefill(128) × 1 hit/block
    assert costs.load_s[0] == costs.load_s[1] and costs.prefill_s[0] == costs.prefill_s[1]
    assert policy.choose(full) == (
        1,
        "explore: missed 128 ≥ cached 0 tokens; lowest cost among 2 → worker 11: "
        "776.750 ms = load 775.622 + prefill 1.128 + eviction 0.000",
    )


def test_eviction_only_of_what_does_not_fit(linear_step_model, gpus):
    policy = PrebleE2Policy(kv_capacity_blocks=100)
    hot_history(policy, linear_step_model, gpus(2))
    # 40 used + 55 idle → 5 free: 3 of the 8 new blocks evict; 48 tokens recomputed × 1 hit/block.
    snapshots = gpus(2, {10: {"kv_usage": 0.4, "idle_cached_blocks": 55}})
    costs = policy.costs(context(linear_step_model, snapshots, unrelated(500), now_s=2.0))
    assert costs.eviction_s[0] == pytest.approx(linear_step_model.prefill_alone_s(48), rel=1e-12)


def test_tree_mirrors_capacity_dropping_deepest_blocks(linear_step_model, gpus):
    policy = PrebleE2Policy(kv_capacity_blocks=4)
    snapshots = gpus(2)
    policy.on_routed(context(linear_step_model, snapshots, PROMPT), 0)
    assert policy.matched_tokens(context(linear_step_model, snapshots, PROMPT)).tolist() == [64, 0]


def test_same_inputs_same_choices(linear_step_model, gpus):
    def run():
        policy = ROUTER_POLICIES.get("preble_e2")(kv_capacity_blocks=100)
        out = []
        for step, hashes in enumerate([PROMPT, (*PROMPT, 9), unrelated(100), PROMPT[:2]]):
            ctx = context(linear_step_model, gpus(3), hashes, now_s=float(step))
            out.append(policy.choose(ctx))
            policy.on_routed(ctx, out[-1][0])
        return out

    assert run() == run()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"window_s": 0.0}, "window_s = 0.0, expected > 0"),
        ({"expected_output_tokens": -1}, "expected_output_tokens = -1, expected ≥ 0"),
        ({"kv_capacity_blocks": 0}, "kv_capacity_blocks = 0, expected ≥ 1 or None"),
    ],
)
def test_rejects_bad_settings(kwargs, message):
    with pytest.raises(ValueError) as err:
        PrebleE2Policy(**kwargs)
    assert str(err.value) == message
