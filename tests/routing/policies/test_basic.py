"""Tests for kvcost.routing.policies.basic (ROUTER_POLICIES and kvcost's own three policies)."""

from dataclasses import replace

import numpy as np
import pytest

from kvcost.core.composition import TermPredictions
from kvcost.core.hardware import StepTimeModel
from kvcost.core.types import DirectoryMatch, Namespace, RouteRequest
from kvcost.features.spec import FEATURE_INDEX
from kvcost.routing.policies import ROUTER_POLICIES, PolicyContext, make_policy
from kvcost.routing.policies.basic import (
    RecentRoutes,
    arrival_delay_price_s,
    duplicate_price_s,
    kv_wait_near_ties,
    memory_hold_price_s,
    memory_pressure,
    prefill_s_per_token,
)

REQUEST = RouteRequest(0, 0.0, 1000, (1,), Namespace("linear"))


def context(
    make_snapshot, queue_s, prefill_s, reusable=None, load=None, allowed=None, snapshot_fields=None, step_models=None
):
    n = len(queue_s)
    zeros = np.zeros(n)
    predictions = TermPredictions(
        queue_s=np.array(queue_s, dtype=float),
        lookup_s=zeros,
        transfer_s=zeros,
        prefill_s=np.array(prefill_s, dtype=float),
        first_token_s=zeros,
    )
    return PolicyContext(
        request=REQUEST,
        snapshots=tuple(make_snapshot(10 + i, **(snapshot_fields or [{}] * n)[i]) for i in range(n)),
        reusable_tokens=np.array(reusable if reusable is not None else [0] * n, dtype=np.int64),
        predictions=predictions,
        load_tokens=np.array(load if load is not None else [0] * n, dtype=np.float64),
        allowed=np.array(allowed if allowed is not None else [True] * n),
        step_models=step_models or {},
    )


def test_registry_names_and_unknown():
    assert ROUTER_POLICIES.names() == [
        "aibrix_prefix_cache",
        "cost_aware",
        "dualmap",
        "dynamo_kv",
        "learned_cost_aware",
        "least_loaded",
        "llmd_default",
        "llmd_predicted_latency",
        "lmetric",
        "mooncake_conductor",
        "oracle",
        "preble_e2",
        "round_robin",
        "sglang_cache_aware",
    ]
    with pytest.raises(KeyError) as err:
        make_policy("random")
    assert err.value.args[0] == (
        f"unknown router policy 'random'; expected one of: {', '.join(ROUTER_POLICIES.names())}"
    )


def test_make_policy_gives_fresh_instances():
    a, b = make_policy("round_robin"), make_policy("round_robin")
    assert a is not b and a.name == "round_robin"


def test_round_robin_cycles(make_snapshot):
    policy = make_policy("round_robin")
    ctx = context(make_snapshot, [0.0, 0.0, 0.0], [0.0, 0.0, 0.0])
    assert [policy.choose(ctx)[0] for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert policy.choose(ctx)[1] == "round robin"


def test_least_loaded_lowest_tokens_first_index_on_ties(make_snapshot):
    policy = make_policy("least_loaded")
    ctx = context(make_snapshot, [0.0] * 3, [0.0] * 3, load=[500.0, 30.0, 30.0])
    assert policy.choose(ctx) == (1, "least outstanding work 30 tokens")


def test_least_loaded_ignores_predictions_and_skew(make_snapshot):
    ctx = context(make_snapshot, [0.0, 9.0], [0.0, 9.0], load=[10.0, 5.0], allowed=[True, False])
    assert make_policy("least_loaded").choose(ctx)[0] == 1


def test_cost_aware_min_ttft_and_reason_names_best_hit_worker(make_snapshot):
    # docs/architecture.md §1: hot 250 + 20 ms, cold 30 + 180 ms
    ctx = context(make_snapshot, [0.25, 0.03], [0.02, 0.18], reusable=[8192, 0])
    index, reason = make_policy("cost_aware").choose(ctx)
    assert index == 1
    assert reason == "min predicted TTFT 210.0 ms, reuse 0 tokens; best-hit worker 10 not chosen (270.0 ms)"


def test_cost_aware_respects_skew_mask(make_snapshot):
    ctx = context(make_snapshot, [0.0, 0.1, 0.2], [0.0] * 3, reusable=[512, 0, 0], allowed=[False, True, True])
    index, reason = make_policy("cost_aware").choose(ctx)
    assert index == 1
    assert reason.endswith("best-hit worker 10 not chosen (skew limit)")


def test_cost_aware_ties_to_less_loaded_then_lower_index(make_snapshot):
    policy = make_policy("cost_aware")
    ctx = context(make_snapshot, [0.1, 0.1, 0.1], [0.0] * 3, load=[50.0, 20.0, 20.0])
    assert policy.choose(ctx) == (1, "min predicted TTFT 100.0 ms, reuse 0 tokens")


def test_memory_pressure_is_running_plus_queued_blocks_over_capacity(make_snapshot):
    fields = [
        {"kv_usage": 0.5, "kv_capacity_blocks": 100, "waiting_prompt_blocks": 30},
        {"kv_usage": 0.9, "kv_capacity_blocks": 100, "waiting_prompt_blocks": 50},  # clipped to 1
        {"kv_usage": 0.25, "kv_capacity_blocks": 0, "waiting_prompt_blocks": 40},  # capacity unknown
    ]
    ctx = context(make_snapshot, [0.0] * 3, [0.0] * 3, snapshot_fields=fields)
    assert memory_pressure(ctx).tolist() == [0.8, 1.0, 0.25]


def test_duplicate_price_is_pressure_times_prefill_of_the_prefix_held_elsewhere(make_snapshot):
    # 1000-token request; worker 0 holds 800 of it, worker 1 none (0.1 s to prefill all 1000 there)
    fields = [{"kv_usage": 0.5}, {"kv_usage": 0.5}]
    ctx = context(make_snapshot, [0.0, 0.0], [0.02, 0.1], reusable=[800, 0], snapshot_fields=fields)
    assert duplicate_price_s(ctx) == pytest.approx([0.0, 0.5 * 800 * 0.1 / 1000], abs=1e-15)


def test_cost_aware_keeps_the_prefix_holder_under_memory_pressure_only(make_snapshot):
    # hot 250 + 20 ms holding 800 tokens, cold 30 + 180 ms: cold wins on TTFT (210 vs 270 ms)
    free = context(make_snapshot, [0.25, 0.03], [0.02, 0.18], reusable=[800, 0])
    assert make_policy("cost_aware").choose(free)[0] == 1
    # the cold worker's KV is full of running requests: a second copy there costs 800 × 0.18 ms
    full = [{}, {"kv_usage": 1.0}]
    busy = context(make_snapshot, [0.25, 0.03], [0.02, 0.18], reusable=[800, 0], snapshot_fields=full)
    assert make_policy("cost_aware").choose(busy) == (0, "min predicted TTFT 270.0 ms, reuse 800 tokens")
    assert make_policy("cost_aware", duplicate_price_weight=0.0).choose(busy)[0] == 1
    # the other way round: the holder is under pressure, the cold worker pays the price of its copy
    both = [{"kv_usage": 1.0}, {"kv_usage": 0.25}]
    ctx = context(make_snapshot, [0.25, 0.03], [0.02, 0.18], reusable=[800, 0], snapshot_fields=both)
    index, reason = make_policy("cost_aware").choose(ctx)
    assert index == 1
    assert reason == (
        "min predicted TTFT + price 210.0 + 36.0 ms, reuse 0 tokens; best-hit worker 10 not chosen (270.0 ms)"
    )


def _memory_bound(waiting: int, **fields) -> dict:
    """A worker whose KV is full: 100 blocks, 3 decoders over 9,000 context tokens, ``waiting`` queued
    10-token prompts of one block each."""
    return {
        "kv_usage": 1.0,
        "kv_capacity_blocks": 100,
        "running_requests": 3,
        "decode_context_tokens": 9000,
        "waiting_prefill": ((10, 0),) * waiting,
        "waiting_prompt_blocks": waiting,
    } | fields


def test_memory_hold_price_is_blocks_times_hold_over_capacity_times_waiting(make_snapshot, linear_step_model):
    # 1000-token request, 512-token blocks: 1 new block where 800 tokens are held, 2 elsewhere.
    # Held blocks: the typical waiting request's 8 / 8 = 1, + 0 on the holder, + 1 for a second copy.
    # Decode step with the request: 1 µs × 4 + 1e-6 s × (9000 + 1000) + 1 ms = 11.004 ms; 172 steps held.
    fields = [
        _memory_bound(2),
        _memory_bound(2),
        _memory_bound(0),  # nothing waits: no one to delay
        _memory_bound(2, kv_capacity_blocks=0),  # capacity unknown
        _memory_bound(2, kv_usage=0.23),  # pressure 0.23 + 2 waiting blocks / 100 = 0.25
    ]
    ctx = context(
        make_snapshot,
        [0.0] * 5,
        [0.0] * 5,
        reusable=[800, 0, 0, 0, 0],
        snapshot_fields=fields,
        step_models={"linear-gpu": linear_step_model},
    )
    held_s = 172 * 0.011004 / 100 * 2
    assert memory_hold_price_s(ctx).tolist() == pytest.approx([held_s, 2 * held_s, 0.0, 0.0, 0.25 * 2 * held_s])
    halved = [held_s / 2, held_s, 0.0, 0.0, 0.25 * held_s]
    assert memory_hold_price_s(ctx, hold_tokens=86).tolist() == pytest.approx(halved)
    # the hold defaults to the router's estimate of a decoder's remaining output; an explicit one wins
    routed = replace(ctx, remaining_decode_tokens=86.0)
    assert memory_hold_price_s(routed).tolist() == pytest.approx(halved)
    full = [held_s, 2 * held_s, 0.0, 0.0, 0.5 * held_s]
    assert memory_hold_price_s(routed, hold_tokens=172).tolist() == pytest.approx(full)


def test_memory_hold_price_ranks_workers_alike_for_a_short_and_a_long_request(make_snapshot, linear_step_model):
    # No reuse: a 1000-token request allocates 2 blocks, a 5000-token one 10, wherever they go. Both
    # are priced as the typical waiting request, 8 blocks / 8 requests = 1 block, so the worker with
    # 6 waiting costs 3× the one with 2 for both (an own-size price would sort long prompts away
    # from crowded workers). Decode steps: 11.004 ms and 1 µs × 4 + 1e-6 s × (9000 + 5000) + 1 ms.
    fields = [_memory_bound(2), _memory_bound(6)]
    short = context(
        make_snapshot, [0.0] * 2, [0.0] * 2, snapshot_fields=fields, step_models={"linear-gpu": linear_step_model}
    )
    long = replace(short, request=RouteRequest(0, 0.0, 5000, (1,) * 9, Namespace("linear")))
    assert memory_hold_price_s(short).tolist() == pytest.approx([172 * 0.011004 / 100 * w for w in (2, 6)])
    assert memory_hold_price_s(long).tolist() == pytest.approx([172 * 0.015004 / 100 * w for w in (2, 6)])


def test_memory_hold_price_is_zero_when_nothing_waits_anywhere(make_snapshot, linear_step_model):
    fields = [_memory_bound(0), _memory_bound(0)]
    ctx = context(
        make_snapshot, [0.0] * 2, [0.0] * 2, snapshot_fields=fields, step_models={"linear-gpu": linear_step_model}
    )
    assert memory_hold_price_s(ctx).tolist() == [0.0, 0.0]


def test_cost_aware_keeps_a_family_on_its_memory_bound_holder_when_requests_wait(make_snapshot, linear_step_model):
    # holder 400 ms, cold 210 ms + duplicate price 800 × 0.18 ms = 354 ms: the cold worker wins
    # without the memory price; with 10 waiting on both, the cold worker holds the typical waiting
    # request's block + the second copy's, 378.5 ms, against the holder's one block, 189.3 ms
    fields = [_memory_bound(10), _memory_bound(10)]
    ctx = context(
        make_snapshot,
        [0.38, 0.03],
        [0.02, 0.18],
        reusable=[800, 0],
        snapshot_fields=fields,
        step_models={"linear-gpu": linear_step_model},
    )
    assert make_policy("cost_aware", memory_price_weight=0.0).choose(ctx)[0] == 1
    assert make_policy("cost_aware").choose(ctx) == (0, "min predicted TTFT + price 400.0 + 189.3 ms, reuse 800 tokens")


@pytest.mark.parametrize(
    "name", ["duplicate_price_weight", "memory_price_weight", "arrival_price_weight", "hold_tokens"]
)
@pytest.mark.parametrize("value", [-0.5, float("nan")])
def test_cost_aware_refuses_a_negative_weight_or_hold(name, value):
    with pytest.raises(ValueError, match=f"{name} = {value}, expected a number ≥ 0"):
        make_policy("cost_aware", **{name: value})


def test_recent_routes_give_each_workers_rate_and_the_carriers_of_a_block():
    recent = RecentRoutes(window=3)
    assert recent.rates_per_s([10, 11], 5.0).tolist() == [0.0, 0.0]  # no record: no rate
    recent.add(0.0, 11, [1, 2, 3])
    recent.add(1.0, 11, [1, 2])
    recent.add(2.0, 10, [50])
    assert recent.rates_per_s([10, 11, 12], 4.0).tolist() == [0.25, 0.5, 0.0]  # over the 4 s since the oldest
    assert (recent.carriers(1), recent.carriers(3), recent.carriers(9)) == (2, 1, 0)
    recent.add(3.0, 12, [1])  # the oldest record leaves: 3 s span, block 3 carried by none
    assert recent.rates_per_s([10, 11, 12], 4.0).tolist() == pytest.approx([1 / 3, 1 / 3, 1 / 3])
    assert (recent.carriers(1), recent.carriers(3)) == (2, 0)
    with pytest.raises(ValueError, match="window = 1, expected an integer ≥ 2"):
        RecentRoutes(window=1)


def arrival_context(make_snapshot, recent_blocks=(1, 2, 3, 4, 5, 6, 7, 8)):
    """A 1,000-token request of 10 blocks of 100; worker 10 holds 800 tokens, 11 and 12 none (0.1 s to
    prefill all 1,000 there); at 4 s, worker 11 was sent two requests in the last 4 s, 10 one, 12 none."""
    request = RouteRequest(0, 4.0, 1000, tuple(range(1, 11)), Namespace("linear", block_size_tokens=100))
    ctx = context(make_snapshot, [0.25, 0.03, 0.03], [0.02, 0.1, 0.1], reusable=[800, 0, 0])
    recent = RecentRoutes()
    recent.add(0.0, 11, recent_blocks)
    recent.add(1.0, 11, [90])
    recent.add(2.0, 10, [91])
    return replace(ctx, request=request, now_s=4.0), recent


def test_arrival_price_is_the_rate_times_the_wasted_prefill_squared_over_two_per_carrier(make_snapshot):
    # W = 800 × 0.1 ÷ 1000 = 0.08 s on 11 and 12; λ = 0.5 / s on 11, 0 on 12; block 8 carried by one request
    ctx, recent = arrival_context(make_snapshot)
    assert arrival_delay_price_s(ctx, recent) == pytest.approx([0.0, 0.5 * 0.08**2 / 2 / 2, 0.0], abs=1e-15)
    ctx, recent = arrival_context(make_snapshot, recent_blocks=(1, 2))  # a private prefix: no carrier
    assert arrival_delay_price_s(ctx, recent) == pytest.approx([0.0, 0.5 * 0.08**2 / 2, 0.0], abs=1e-15)
    assert arrival_delay_price_s(replace(ctx, reusable_tokens=np.zeros(3, dtype=np.int64)), recent).tolist() == [0] * 3


def test_cost_aware_sends_a_move_where_no_arrivals_wait_for_its_recompute(make_snapshot):
    ctx, recent = arrival_context(make_snapshot)
    policy = make_policy("cost_aware")
    policy.recent = recent
    assert policy.choose(ctx)[0] == 2  # 11 and 12 predict 130 ms alike; 12 was sent nothing
    policy.on_routed(ctx, 2)
    assert recent.rates_per_s([12], 4.0).tolist() == [0.25]
    unpriced = make_policy("cost_aware", arrival_price_weight=0.0)
    unpriced.recent = recent
    assert unpriced.choose(ctx)[0] == 1  # the tie goes to the lower index


def _near_tie_context(make_snapshot, step_model, kv_wait_sd_s, reusable=(0, 0, 0), gpus=("linear-gpu",) * 3):
    """Scores 10.0 / 10.5 / 13.0 s; worker 10 has 1,024 prompt tokens queued, 11 and 12 are idle; the request
    is 1,000 tokens (2 blocks of 512). Workers on ``gpus``: ``"linear-gpu"`` is ``step_model``,
    ``"slow-gpu"`` three times slower (:func:`_slow_step_model`)."""
    ctx = context(
        make_snapshot,
        [10.0, 10.5, 13.0],
        [0.0, 0.0, 0.0],
        reusable=list(reusable),
        snapshot_fields=[{"waiting_prefill": ((1024, 0),), "gpu": gpus[0]}, {"gpu": gpus[1]}, {"gpu": gpus[2]}],
        step_models={"linear-gpu": step_model, "slow-gpu": _slow_step_model(step_model)},
    )
    matches = tuple(
        DirectoryMatch(10 + i, blocks // 512, "gpu" if blocks else "none", 0.0) for i, blocks in enumerate(reusable)
    )
    spread = None if kv_wait_sd_s is None else np.array(kv_wait_sd_s, dtype=float)
    return replace(ctx, matches=matches, kv_wait_sd_s=spread)


def test_near_ties_under_the_kv_wait_spread_take_the_least_dynamo_block_cost(make_snapshot, linear_step_model):
    """Spreads 1 / 0 / 1 s: worker 11 is 0.5 s behind, within √(0² + 1²) = 1 s; worker 12 is 3 s behind,
    beyond √2 s. Dynamo's block cost: worker 10 (1,024 + 1,000) ÷ 512 + 2 + 2 = 7.95 blocks (its queued
    prompt's 2 blocks and the request's 2), worker 11 1,000 ÷ 512 + 2 = 3.95, so the near tie goes to 11."""
    policy = make_policy("cost_aware")
    ctx = _near_tie_context(make_snapshot, linear_step_model, [1.0, 0.0, 1.0])
    assert kv_wait_near_ties(ctx, policy.score_s(ctx), 0).tolist() == [0, 1]
    index, reason = policy.choose(ctx)
    assert index == 1
    assert "2 within the KV wait's spread" in reason
    # no spread given, or none anywhere: the lowest score, as before
    for spread in (None, [0.0, 0.0, 0.0]):
        assert make_policy("cost_aware").choose(_near_tie_context(make_snapshot, linear_step_model, spread))[0] == 0
    # 0.4 s each: 0.5 s is within √(0.4² + 0.4²) = 0.57 s; 0.3 s each: beyond 0.42 s
    assert (
        make_policy("cost_aware").choose(_near_tie_context(make_snapshot, linear_step_model, [0.4, 0.4, 0.4]))[0] == 1
    )
    assert (
        make_policy("cost_aware").choose(_near_tie_context(make_snapshot, linear_step_model, [0.3, 0.3, 0.3]))[0] == 0
    )


def test_near_ties_keep_the_candidates_with_the_most_reuse(make_snapshot, linear_step_model):
    # worker 10 holds one block of the prefix: Dynamo's cost there is 6.95 blocks against worker 11's 3.95,
    # but only the holder keeps the most reuse among the near ties
    ctx = _near_tie_context(make_snapshot, linear_step_model, [1.0, 0.0, 1.0], reusable=(512, 0, 0))
    assert make_policy("cost_aware").choose(ctx)[0] == 0


def test_near_ties_refuse_a_spread_of_another_length(make_snapshot, linear_step_model):
    ctx = replace(
        _near_tie_context(make_snapshot, linear_step_model, [1.0, 0.0, 1.0]), kv_wait_sd_s=np.array([1.0, 0.0])
    )
    with pytest.raises(ValueError, match="kv_wait_sd_s 2 values, expected one per candidate"):
        kv_wait_near_ties(ctx, np.zeros(3), 0)


def _slow_step_model(model: StepTimeModel) -> StepTimeModel:
    """``model`` at a third of its speed: thrice the non-attention time and overhead, a third of the FLOP/s and
    bandwidth."""
    gpu = replace(
        model.gpu,
        name="slow-gpu",
        peak_dense_bf16_flops=model.gpu.peak_dense_bf16_flops / 3,
        hbm_bytes_per_s=model.gpu.hbm_bytes_per_s / 3,
    )
    profile = replace(model.profile, per_layer_s=[3 * t for t in model.profile.per_layer_s])
    return StepTimeModel(
        model.model,
        gpu,
        profile,
        token_budget=model.token_budget,
        attention_flops_efficiency=model.attention_flops_efficiency,
        decode_bandwidth_efficiency=model.decode_bandwidth_efficiency,
        step_overhead_s=3 * model.step_overhead_s,
    )


def test_prefill_seconds_per_token_by_gpu_and_by_a_straggling_step(make_snapshot, linear_step_model):
    """The linear GPU's full chunk: 8,192 × 1 µs + 8,192 × 8,193 ÷ 2 pairs × 1e-12 s + 1 ms = 9.2255… ms, so
    1.12616… µs a token; the slow GPU thrice that."""
    ctx = _near_tie_context(make_snapshot, linear_step_model, None, gpus=("linear-gpu", "slow-gpu", "linear-gpu"))
    full_chunk_s = 8192e-6 + 8192 * 8193 / 2 * 1e-12 + 1e-3
    assert prefill_s_per_token(ctx) == pytest.approx(np.array([1, 3, 1]) * full_chunk_s / 8192, rel=1e-12)
    # last step ÷ profile: 1.29 and 1 / 1.29 are jitter (inside the band of 1.3), 1.67 a straggler
    for ratios, factors in (([1.29, 1 / 1.29, 1.67], [1, 1, 1.67]), ([0.5, 1.0, 1.31], [0.5, 1, 1.31])):
        features = np.zeros((3, len(FEATURE_INDEX)))
        features[:, FEATURE_INDEX["recent_step_ratio"]] = ratios
        expected = np.array(factors) * [1, 3, 1] * full_chunk_s / 8192
        assert prefill_s_per_token(replace(ctx, features=features)) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="gpu = 'other-gpu' of worker 10 has no step model"):
        prefill_s_per_token(replace(ctx, snapshots=(make_snapshot(10, gpu="other-gpu"), *ctx.snapshots[1:])))


def test_near_ties_take_the_block_cost_in_each_workers_seconds(make_snapshot, linear_step_model):
    """Worker 11's 3.95 blocks on a GPU three times slower are 11.85 of the linear GPU's, above worker 10's 7.95:
    the near tie goes to 10 (Dynamo's count alone would take 11)."""
    ctx = _near_tie_context(
        make_snapshot, linear_step_model, [1.0, 0.0, 1.0], gpus=("linear-gpu", "slow-gpu", "linear-gpu")
    )
    policy = make_policy("cost_aware")
    per_block_s = prefill_s_per_token(ctx) * 512
    assert policy.block_cost_s(ctx) == pytest.approx(np.array([7.953125, 3.953125, 3.953125]) * per_block_s)
    assert policy.choose(ctx)[0] == 0


def test_learned_cost_aware_ranks_near_ties_too(make_snapshot, linear_step_model):
    ctx = _near_tie_context(make_snapshot, linear_step_model, [1.0, 0.0, 1.0])
    assert make_policy("learned_cost_aware").choose(ctx)[0] == 1
