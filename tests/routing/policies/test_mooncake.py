"""Tests for kvcost.routing.policies.mooncake (the ``mooncake_conductor`` baseline).

Times come from the conftest linear step model: prefill_alone_s(n, c) =
1 µs × n + 1e-12 s × n × (c + (n + 1) / 2) + 1 ms for n ≤ 8192; 4 KV bytes per token.
"""

import numpy as np
import pytest

from kvcost.core.composition import TermPredictions
from kvcost.core.hardware import GIB_BYTES
from kvcost.core.types import DirectoryMatch, Namespace, RouteRequest, reusable_tokens_for
from kvcost.routing.policies import ROUTER_POLICIES, PolicyContext, make_policy
from kvcost.routing.policies.mooncake import MooncakeConductorPolicy, queue_time_s

BLOCK_TOKENS = 16
INPUT_TOKENS = 1000

# prefill_alone_s of the linear model, seconds
PREFILL_4000_0 = 0.004 + 4000 * 2000.5e-12 + 1e-3  # 5.008002 ms
PREFILL_1000_0 = 0.001 + 1000 * 500.5e-12 + 1e-3  # 2.0005005 ms
PREFILL_520_480 = 0.00052 + 520 * 740.5e-12 + 1e-3  # 1.52038506 ms
PREFILL_200_800 = 0.0002 + 200 * 900.5e-12 + 1e-3  # 1.2001801 ms


@pytest.fixture
def make_context(linear_step_model):
    """``make(snapshots, matched_blocks)`` → PolicyContext for a 1000-token prompt (62 full blocks)."""

    def make(snapshots, matched_blocks):
        n = len(snapshots)
        request = RouteRequest(
            0, 0.0, INPUT_TOKENS, tuple(range(1, 63)), Namespace("m", block_size_tokens=BLOCK_TOKENS)
        )
        zeros = np.zeros(n)
        return PolicyContext(
            request=request,
            snapshots=tuple(snapshots),
            reusable_tokens=np.array(
                [reusable_tokens_for(b, BLOCK_TOKENS, INPUT_TOKENS) for b in matched_blocks], dtype=np.int64
            ),
            predictions=TermPredictions(zeros, zeros, zeros, zeros, zeros),
            load_tokens=zeros,
            allowed=np.ones(n, dtype=bool),
            matches=tuple(
                DirectoryMatch(s.worker_id, b, "gpu" if b else "none", 0.0)
                for s, b in zip(snapshots, matched_blocks, strict=True)
            ),
            step_models={"linear-gpu": linear_step_model},
        )

    return make


@pytest.fixture
def hot_and_cold(make_snapshot, make_context):
    """Worker 10 holds 800 tokens (50 blocks) behind a 4000-token queue; 11 is idle; 12 has two queued."""
    snapshots = [
        make_snapshot(10, waiting_prefill=((4000, 0),)),
        make_snapshot(11),
        make_snapshot(12, waiting_prefill=((1000, 0), (520, 480))),
    ]
    return make_context(snapshots, [50, 0, 0])


# 3200 bytes (800 tokens × 4) at 6.4 MB/s = 0.5 ms, + 0.1 ms setup
FAST_LINK = dict(transfer_bytes_per_s=6.4e6, transfer_setup_s=1e-4)


def test_registered_under_its_name():
    assert ROUTER_POLICIES.get("mooncake_conductor") is MooncakeConductorPolicy
    policy = make_policy("mooncake_conductor")
    assert policy.name == "mooncake_conductor"
    assert policy.fetch_remote_prefix is False
    assert policy.transfer_bytes_per_s == 12 * GIB_BYTES


def test_queue_is_the_sum_of_queued_prefill_times(make_snapshot, linear_step_model):
    snapshot = make_snapshot(0, waiting_prefill=((1000, 0), (520, 480)))
    assert queue_time_s(linear_step_model, snapshot) == pytest.approx(PREFILL_1000_0 + PREFILL_520_480, rel=1e-12)
    assert queue_time_s(linear_step_model, make_snapshot(1)) == 0.0


def test_local_estimates_by_hand(hot_and_cold):
    est = MooncakeConductorPolicy().estimates(hot_and_cold)
    np.testing.assert_allclose(est.queue_s, [PREFILL_4000_0, 0.0, PREFILL_1000_0 + PREFILL_520_480], rtol=1e-12)
    np.testing.assert_allclose(est.prefill_s, [PREFILL_200_800, PREFILL_1000_0, PREFILL_1000_0], rtol=1e-12)
    np.testing.assert_array_equal(est.transfer_s, [0.0, 0.0, 0.0])
    np.testing.assert_allclose(est.ttft_s, est.queue_s + est.prefill_s, rtol=1e-15)
    np.testing.assert_array_equal(est.prefix_tokens, [800, 0, 0])
    np.testing.assert_array_equal(est.over_threshold, [False, True, True])
    np.testing.assert_array_equal(est.fetch, [False, False, False])


def test_fetch_off_uses_local_matches_and_says_what_it_passed_over(hot_and_cold):
    assert MooncakeConductorPolicy(**FAST_LINK).choose(hot_and_cold) == (
        1,
        "min est. TTFT 2.0 ms = queue 0.0 + prefill 2.0 ms; local prefix 0 tokens; "
        "longer prefix 800 tokens on worker 10 not fetched (fetch off)",
    )


def test_fetch_on_pays_transfer_and_prefills_from_the_best_prefix(hot_and_cold):
    policy = MooncakeConductorPolicy(fetch_remote_prefix=True, **FAST_LINK)
    est = policy.estimates(hot_and_cold)
    np.testing.assert_allclose(est.transfer_s, [0.0, 6e-4, 6e-4], rtol=1e-12)
    np.testing.assert_allclose(est.prefill_s, [PREFILL_200_800] * 3, rtol=1e-12)
    np.testing.assert_allclose(est.ttft_s[1], 6e-4 + PREFILL_200_800, rtol=1e-12)
    assert policy.choose(hot_and_cold) == (
        1,
        "min est. TTFT 1.8 ms = transfer 0.6 + queue 0.0 + prefill 1.2 ms; "
        "fetch 800 tokens from worker 10 (prefix 800 tokens)",
    )


def test_fetch_branch_follows_the_paper_even_when_recompute_is_faster(hot_and_cold):
    # Default link: 3200 B / 12 GiB/s + 1 ms setup ≈ 1.0002 ms; the paper takes the fetch branch
    # whenever best > local × threshold, so worker 11 is estimated at 2.2 ms, not its local 2.0 ms.
    index, reason = MooncakeConductorPolicy(fetch_remote_prefix=True).choose(hot_and_cold)
    transfer_s = 3200 / (12 * GIB_BYTES) + 1e-3
    assert index == 1
    assert reason.startswith(f"min est. TTFT {(transfer_s + PREFILL_200_800) * 1e3:.1f} ms = transfer 1.0 + ")


def test_balancing_threshold_is_a_ratio_of_prefix_lengths(make_snapshot, make_context):
    ctx = make_context([make_snapshot(10, waiting_prefill=((4000, 0),)), make_snapshot(11)], [50, 30])
    # worker 11 holds 480 tokens, the best is 800: 800 > 480 × 1.5 but not > 480 × 2
    strict = MooncakeConductorPolicy(fetch_remote_prefix=True, kvcache_balancing_threshold=2.0, **FAST_LINK)
    assert strict.choose(ctx) == (1, "min est. TTFT 1.5 ms = queue 0.0 + prefill 1.5 ms; local prefix 480 tokens")
    assert strict.estimates(ctx).ttft_s[1] == pytest.approx(PREFILL_520_480, rel=1e-12)
    loose = MooncakeConductorPolicy(fetch_remote_prefix=True, kvcache_balancing_threshold=1.5, **FAST_LINK)
    # 320 tokens × 4 B at 6.4 MB/s = 0.2 ms, + 0.1 ms setup
    assert loose.estimates(ctx).ttft_s[1] == pytest.approx(3e-4 + PREFILL_200_800, rel=1e-12)
    assert loose.choose(ctx)[1].endswith("fetch 320 tokens from worker 10 (prefix 800 tokens)")


def test_ties_go_to_the_lowest_index(make_snapshot, make_context):
    ctx = make_context([make_snapshot(10), make_snapshot(11)], [0, 0])
    assert MooncakeConductorPolicy().choose(ctx)[0] == 0


def test_invalid_settings_are_refused():
    with pytest.raises(ValueError, match="transfer_bytes_per_s = 0"):
        MooncakeConductorPolicy(transfer_bytes_per_s=0)
    with pytest.raises(ValueError, match="kvcache_balancing_threshold = -1"):
        MooncakeConductorPolicy(kvcache_balancing_threshold=-1)
