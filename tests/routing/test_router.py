"""Tests for kvcost.routing.router (Router, RouterSettings, outstanding_tokens, hot-spot skew limit).

Step times come from the linear step model of tests/conftest.py: 1 µs per batch
token, 1e-12 s per prefill attention token pair, 1 ms per step, budget 8192.
"""

import math
from dataclasses import replace

import numpy as np
import pytest

from kvcost.core.composition import CalibratedTTFT, TermPredictions
from kvcost.core.links import LinkSpec
from kvcost.core.types import Namespace, ReusePlan, RouteRequest
from kvcost.features.finish_times import finish_steps
from kvcost.features.nominal import NominalCosts
from kvcost.features.spec import FEATURE_NAMES
from kvcost.routing.directory import CacheDirectory
from kvcost.routing.router import (
    NoCompatibleCandidate,
    Router,
    RouterSettings,
    compatible_candidates,
    outstanding_tokens,
)

NS = Namespace("linear", block_size_tokens=512)


def request(input_tokens, hashes, request_id=0):
    return RouteRequest(request_id, 0.0, input_tokens, tuple(hashes), NS)


class FixedCostModel:
    """Returns the same per-candidate terms for every request (seconds)."""

    learned = calibrated = False

    def __init__(self, queue_s, prefill_s, lookup_s=None):
        zeros = np.zeros(len(queue_s))
        self.predictions = TermPredictions(
            queue_s=np.array(queue_s),
            lookup_s=np.array(lookup_s) if lookup_s else zeros,
            transfer_s=zeros,
            prefill_s=np.array(prefill_s),
            first_token_s=zeros,
        )
        self.seen_shapes = []

    def predict(self, features):
        self.seen_shapes.append(features.shape)
        return self.predictions


@pytest.fixture
def make_router(linear_step_model):
    def make(directory=None, **settings):
        return Router(directory or CacheDirectory(), {"linear-gpu": linear_step_model}, RouterSettings(**settings))

    return make


def hot_directory():
    """Worker 0 holds blocks 1..16 (8192 tokens) in GPU; worker 1 holds nothing."""
    directory = CacheDirectory()
    directory.apply_stored(NS, 0, list(range(1, 17)), parent_hash=None, tier="gpu", now_s=0.0)
    return directory


def test_design_worked_example_cost_aware_picks_cold_worker(make_router, make_snapshot):
    # docs/architecture.md §1: hot queue 250 ms + preparation/compute 20 ms; cold 30 ms + 180 ms
    router = make_router(hot_directory())
    router.cost_model = FixedCostModel(queue_s=[0.25, 0.03], lookup_s=[0.005, 0.0], prefill_s=[0.015, 0.18])
    hot = make_snapshot(0, waiting_prefill=((30_000, 0),))
    cold = make_snapshot(1)
    decision = router.route(request(8704, range(1, 18)), [hot, cold], now_s=1.0)
    assert decision.predictions.ttft_s.tolist() == pytest.approx([0.27, 0.21])
    assert decision.reusable_tokens.tolist() == [8192, 0]
    # pure cache affinity would have chosen the hot worker
    assert int(np.argmax(decision.reusable_tokens)) == 0
    assert (decision.worker_id, decision.chosen_index) == (1, 1)
    assert decision.reason == ("min predicted TTFT 210.0 ms, reuse 0 tokens; best-hit worker 0 not chosen (270.0 ms)")
    assert router.cost_model.seen_shapes == [(2, len(FEATURE_NAMES))]


def test_analytic_model_prefers_idle_cold_worker_over_long_hot_queue(make_router, make_snapshot):
    router = make_router(hot_directory())
    # 17-block request (8704 tokens); the hot worker reuses 8192 and prefills 512,
    # behind 24576 queued tokens (3 full steps) and 2 ms left in its running step
    hot = make_snapshot(0, waiting_prefill=((24_576, 0),), step_remaining_s=0.002)
    cold = make_snapshot(1)
    decision = router.route(request(8704, range(1, 18)), [hot, cold], now_s=1.0)
    p = decision.predictions
    # hot: 2 ms + 3 × (8192 µs + 1 ms) + 24576 × 24577 / 2 pairs × 1e-12 s
    assert p.queue_s.tolist() == pytest.approx([0.029878006016, 0.0])
    # hot: 512 µs + 1 ms + 512 × (8192 + 513 / 2) pairs; cold: 9.192 + 1.512 ms + 8704 × 8705 / 2 pairs
    assert p.prefill_s.tolist() == pytest.approx([0.001516325632, 0.01074188416])
    assert p.lookup_s.tolist() == pytest.approx([3.7e-4, 3.7e-4])  # 0.2 ms + 17 × 10 µs
    assert p.first_token_s.tolist() == [2e-3, 2e-3]
    assert p.transfer_s.tolist() == [0.0, 0.0]
    assert p.ttft_s.tolist() == pytest.approx([0.033764331648, 0.01311188416])
    assert decision.worker_id == 1
    assert decision.reason == ("min predicted TTFT 13.1 ms, reuse 0 tokens; best-hit worker 0 not chosen (33.8 ms)")


def test_analytic_model_prefers_hot_worker_when_its_queue_is_empty(make_router, make_snapshot):
    router = make_router(hot_directory())
    decision = router.route(request(8704, range(1, 18)), [make_snapshot(0), make_snapshot(1)], 1.0)
    assert decision.predictions.ttft_s.tolist() == pytest.approx([3.7e-4 + 0.001516325632 + 2e-3, 0.01311188416])
    assert decision.worker_id == 0
    assert decision.reason == "min predicted TTFT 3.9 ms, reuse 8192 tokens"


def test_decision_carries_matches_and_capped_reuse(make_router, make_snapshot):
    directory = CacheDirectory()
    directory.apply_stored(NS, 5, [1, 2], parent_hash=None, tier="cpu", now_s=1.0)
    router = make_router(directory, policy="round_robin")
    decision = router.route(request(1024, [1, 2], request_id=9), [make_snapshot(5), make_snapshot(6)], 4.0)
    assert decision.request_id == 9
    assert decision.worker_ids == (5, 6)
    assert [(m.worker_id, m.reusable_blocks, m.tier, m.age_s) for m in decision.matches] == [
        (5, 2, "cpu", 3.0),
        (6, 0, "none", float("inf")),
    ]
    assert decision.reusable_tokens.dtype == np.int64
    assert decision.reusable_tokens.tolist() == [1023, 0]  # fully cached: 1 token still computed
    assert decision.features.shape == (2, len(FEATURE_NAMES))


def test_no_candidates(make_router):
    with pytest.raises(ValueError, match="snapshots is empty"):
        make_router().route(request(10, []), [], 0.0)


def test_outstanding_tokens_counts_tokens_not_requests(make_snapshot):
    snaps = [
        make_snapshot(0, waiting_prefill=((10_000, 0),)),
        make_snapshot(1, waiting_prefill=((10, 0), (20, 5), (30, 0)), running_requests=2),
    ]
    queued = np.array([s.queued_prefill_tokens for s in snaps], dtype=np.float64)
    running = np.array([s.running_requests for s in snaps], dtype=np.float64)
    assert outstanding_tokens(queued, running, expected_decode_tokens=100).tolist() == [10_000.0, 260.0]


def test_least_loaded_picks_many_tiny_over_one_huge(make_router, make_snapshot):
    router = make_router(policy="least_loaded")
    one_huge = make_snapshot(0, waiting_prefill=((10_000, 0),))
    three_tiny = make_snapshot(1, waiting_prefill=((10, 0), (10, 0), (10, 0)))
    decision = router.route(request(100, []), [one_huge, three_tiny], 0.0)
    assert decision.worker_id == 1
    assert decision.reason == "least outstanding work 30 tokens"


def test_round_robin_cycles_through_router(make_router, make_snapshot):
    router = make_router(policy="round_robin")
    snaps = [make_snapshot(w) for w in (3, 4, 5)]
    chosen = [router.route(request(10, [], i), snaps, float(i)).worker_id for i in range(5)]
    assert chosen == [3, 4, 5, 3, 4]


def route_sequence(router, make_snapshot, n):
    """Route ``n`` 100-token requests to 3 idle workers; the cost model always prefers 0, then 1, then 2."""
    router.cost_model = FixedCostModel(queue_s=[0.1, 0.2, 0.3], prefill_s=[0.0, 0.0, 0.0])
    snaps = [make_snapshot(w) for w in (0, 1, 2)]
    return [router.route(request(100, [], i), snaps, float(i)).worker_id for i in range(n)]


def test_skew_limit_excludes_worker_over_share(make_router, make_snapshot):
    # 3 workers, cap (1 + 0.5) / 3 = 0.5 of the window's routed tokens
    router = make_router(max_share_over_mean=0.5)
    # 1st: empty window; 2nd: worker 0 holds 100 %; 3rd: 50/50 allowed; 4th: worker 0 at 2/3
    assert route_sequence(router, make_snapshot, 4) == [0, 1, 0, 1]


def test_skew_window_forgets_old_decisions(make_router, make_snapshot):
    router = make_router(max_share_over_mean=0.5, skew_window_requests=2)
    # window of 2: after [1, 0] the 4th request sees 50/50 again; after [0, 0] worker 0 is at 100 %
    assert route_sequence(router, make_snapshot, 5) == [0, 1, 0, 0, 1]


def test_skew_limit_is_inclusive_and_at_one_never_binds_with_two_workers(make_router, make_snapshot):
    # max_share_over_mean = 1: with 2 workers the cap is 100 %
    router = make_router(max_share_over_mean=1.0)
    router.cost_model = FixedCostModel(queue_s=[0.1, 0.2], prefill_s=[0.0, 0.0])
    snaps = [make_snapshot(0), make_snapshot(1)]
    assert [router.route(request(100, [], i), snaps, 0.0).worker_id for i in range(3)] == [0, 0, 0]


def test_skew_limit_is_off_by_default(make_router, make_snapshot):
    # with the old default cap (1 + 1) / 3 the 3rd request would leave worker 0 (at 100 % of the window)
    assert RouterSettings().max_share_over_mean == math.inf
    assert route_sequence(make_router(), make_snapshot, 4) == [0, 0, 0, 0]


def test_skew_limit_allows_everyone_when_everyone_is_over(make_router, make_snapshot):
    router = make_router()
    # With validated settings (cap >= 1/n) some candidate is always at or under the cap, so this
    # guard needs a negative cap: force max_share_over_mean = -2 (cap = -1/3) past validation.
    object.__setattr__(router.settings, "max_share_over_mean", -2.0)
    router.cost_model = FixedCostModel(queue_s=[0.1, 0.2], prefill_s=[0.0, 0.0])
    # worker 0 is predicted fastest but more loaded: were nobody allowed, the tie-break
    # on load among all-excluded candidates would pick worker 1
    snaps = [make_snapshot(0, waiting_prefill=((50, 0),)), make_snapshot(1)]
    decisions = [router.route(request(100, [], i), snaps, 0.0) for i in range(3)]
    assert [d.worker_id for d in decisions] == [0, 0, 0]
    assert decisions[-1].reason == "min predicted TTFT 100.0 ms, reuse 0 tokens"


def test_skew_limit_does_not_apply_to_least_loaded(make_router, make_snapshot):
    router = make_router(policy="least_loaded", max_share_over_mean=0.0)
    snaps = [make_snapshot(0), make_snapshot(1, waiting_prefill=((5, 0),))]
    assert [router.route(request(100, [], i), snaps, 0.0).worker_id for i in range(3)] == [0, 0, 0]


def route_hot_family(router, make_snapshot, queue_s, n):
    """Route ``n`` 17-block requests extending worker 0's 16 GPU blocks to 3 idle workers (skew cap 0.5)."""
    router.cost_model = FixedCostModel(queue_s=queue_s, prefill_s=[0.0, 0.15, 0.15])
    snaps = [make_snapshot(w) for w in (0, 1, 2)]
    return [router.route(request(8704, range(1, 18), i), snaps, float(i)) for i in range(n)]


def test_skew_limit_keeps_the_prefix_holder_when_its_queue_is_empty(make_router, make_snapshot):
    # kvcost issue 13: from the 2nd request worker 0 holds 100 % of the window (cap 50 %); the old
    # rule excluded it and sent the family to worker 1 (150 ms, no reuse) although 0 had no queue
    router = make_router(hot_directory(), max_share_over_mean=0.5)
    decisions = route_hot_family(router, make_snapshot, [0.0, 0.0, 0.0], 3)
    assert [d.worker_id for d in decisions] == [0, 0, 0]
    assert decisions[-1].reason == "min predicted TTFT 0.0 ms, reuse 8192 tokens"


def test_skew_limit_still_excludes_a_prefix_holder_that_queues_longer(make_router, make_snapshot):
    # holder 0: 200 ms queue + no prefill; 1 and 2: 100 ms queue + 150 ms prefill. Over its share,
    # worker 0 queues longer than the best allowed alternative (worker 1): the limit applies
    router = make_router(hot_directory(), max_share_over_mean=0.5)
    decisions = route_hot_family(router, make_snapshot, [0.2, 0.1, 0.1], 4)
    # 1st: empty window; 2nd: worker 0 at 100 %; 3rd: 50/50 (inclusive cap); 4th: worker 0 at 2/3, and of
    # the two alike, worker 2: the recompute on worker 1, sent a request a moment ago, delays its arrivals
    assert [d.worker_id for d in decisions] == [0, 1, 0, 2]
    assert decisions[1].reason == (
        "min predicted TTFT 250.0 ms, reuse 0 tokens; best-hit worker 0 not chosen (skew limit)"
    )


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("skew_window_requests", 0, "skew_window_requests = 0, expected an integer ≥ 1"),
        ("max_share_over_mean", -0.1, "max_share_over_mean = -0.1, expected a number ≥ 0"),
        ("max_share_over_mean", float("nan"), "max_share_over_mean = nan, expected a number ≥ 0"),
    ],
)
def test_settings_validation_names_field_and_value(field, value, message):
    with pytest.raises(ValueError) as err:
        RouterSettings(**{field: value})
    assert str(err.value) == message


def test_the_router_builds_its_policy_with_the_settings_policy_params(make_router):
    router = make_router(policy_params=(("duplicate_price_weight", 0.0), ("hold_tokens", 32.0)))
    assert (router.policy.duplicate_price_weight, router.policy.hold_tokens, router.policy.memory_price_weight) == (
        0.0,
        32.0,
        1.0,
    )
    with pytest.raises(ValueError, match="name 'hold_tokens', expected a parameter of policy 'dynamo_kv': "):
        RouterSettings(policy="dynamo_kv", policy_params=(("hold_tokens", 32.0),))


def test_unknown_policy_in_settings(make_router):
    with pytest.raises(KeyError, match="unknown router policy 'fastest'"):
        make_router(policy="fastest")


# -- tiers, transfers and compatibility --------------------------------------------------------------

# 16 blocks of 512 tokens at 4 B per token (the linear model): 32,768 B to move
PREFIX_BYTES = 16 * 512 * 4
# idle worker, 8192-token prompt: recompute everything, or fetch 8191 reusable tokens and compute 1
RECOMPUTE_S = 8192e-6 + 1e-3 + 8192 * 8193 / 2 * 1e-12
AFTER_FETCH_S = 1e-6 + 1e-3 + 1 * 8192 * 1e-12
LOAD_S = PREFIX_BYTES / 1e9  # CPU → GPU at 1 GB/s, no setup
# the fetch wins iff network setup + transfer + load + remaining prefill < recompute
BREAK_EVEN_SETUP_S = RECOMPUTE_S - AFTER_FETCH_S - LOAD_S - PREFIX_BYTES / 1e9


@pytest.mark.parametrize(
    ("setup_s", "option"), [(BREAK_EVEN_SETUP_S - 1e-6, "fetch"), (BREAK_EVEN_SETUP_S + 1e-6, "local")]
)
def test_transfer_wins_only_when_saved_compute_exceeds_its_cost(make_router, make_snapshot, setup_s, option):
    costs = NominalCosts(cpu_to_gpu=LinkSpec(1e9, 0.0), network=LinkSpec(1e9, setup_s))
    router = make_router(hot_directory(), tiers=True, transfers=True, costs=costs)
    hot = make_snapshot(0, waiting_prefill=((10**6, 0),))  # holds the prefix behind a long queue
    decision = router.route(request(8192, range(1, 17)), [hot, make_snapshot(1)], now_s=0.0)
    assert decision.worker_id == 1
    plan = decision.plans[1]
    assert plan.option == option
    assert decision.plans[0] == ReusePlan("local", gpu_blocks=16)
    if option == "fetch":
        assert (plan.fetch_blocks, plan.source_id) == (16, 0)
        assert decision.predictions.transfer_s[1] == pytest.approx(setup_s + PREFIX_BYTES / 1e9)
        assert "fetch 16 blocks from worker 0" in decision.reason
    else:
        assert decision.reusable_tokens[1] == 0 and decision.predictions.transfer_s[1] == 0.0


def test_incompatible_layouts_are_never_reused_and_other_models_are_filtered(make_router, make_snapshot):
    router = make_router(hot_directory(), tiers=True, transfers=True)
    snapshots = [
        make_snapshot(0, namespace=NS, waiting_prefill=((10**6, 0),)),
        make_snapshot(1, namespace=replace(NS, kv_layout="fp8-tp1")),  # other dtype: not reusable
        make_snapshot(2, namespace=replace(NS, kv_layout="bf16-tp2")),  # re-shard: allowed, at a cost
        make_snapshot(3, namespace=Namespace("other-model", block_size_tokens=512)),  # cannot serve it
    ]
    decision = router.route(request(8192, range(1, 17)), snapshots, now_s=0.0)
    assert decision.worker_ids == (0, 1, 2)
    assert decision.plans[1] == ReusePlan("local", gpu_blocks=0)
    assert decision.reusable_tokens[1] == 0
    fetch = [p for p in decision.plans if p.option == "fetch"]
    assert all(p.source_id == 0 and p.conversion_factor == 1.0 for p in fetch)
    with pytest.raises(ValueError, match="no candidate serves namespace"):
        router.route(request(8192, range(1, 17)), snapshots[3:], now_s=0.0)


def test_transfers_need_tiers():
    with pytest.raises(ValueError, match="transfers = True needs tiers = True"):
        RouterSettings(transfers=True)


def test_the_router_owns_the_compatibility_filter(make_router, make_snapshot):
    router = make_router()
    other = make_snapshot(3, namespace=Namespace("other-model", block_size_tokens=512))
    assert compatible_candidates(NS, [make_snapshot(0), other]) == [make_snapshot(0)]
    both = [make_snapshot(0), make_snapshot(1)]
    assert compatible_candidates(NS, both) is both  # all serve it: the same list, no copy
    with pytest.raises(NoCompatibleCandidate) as err:
        router.route(request(1024, [1, 2]), [other], now_s=0.0)
    assert isinstance(err.value, ValueError)
    assert str(err.value) == (
        "no candidate serves namespace model='linear' revision='main' adapter='' block_size_tokens=512: "
        f"candidates' namespaces are {[str(other.namespace)]}"
    )


def route_turns(router, make_snapshot, second_at_s):
    """Turn 1 (blocks 1..3) at 1.0 s goes to worker 0 (predicted TTFT 0.1 s there); turn 2 (blocks
    1..5) arrives at ``second_at_s`` while turn 1 is still queued on worker 0 (the directory is empty)."""
    router.cost_model = FixedCostModel(queue_s=[0.0, 0.5], prefill_s=[0.1, 0.1])
    first = router.route(request(1536, [1, 2, 3]), [make_snapshot(0), make_snapshot(1)], 1.0)
    assert first.worker_id == 0
    queued = make_snapshot(0, waiting_prefill=((1536, 0),))
    return router.route(request(2560, [1, 2, 3, 4, 5], 1), [queued, make_snapshot(1)], second_at_s)


def test_next_turn_sees_the_previous_turns_in_flight_prefix(make_router, make_snapshot):
    assert RouterSettings().count_in_flight  # on by default
    decision = route_turns(make_router(), make_snapshot, second_at_s=1.1)
    assert [(m.reusable_blocks, m.tier) for m in decision.matches] == [(3, "gpu"), (0, "none")]
    assert decision.reusable_tokens.tolist() == [1536, 0]


@pytest.mark.parametrize("settings", [{"count_in_flight": False}, {"policy": "least_loaded"}])
def test_in_flight_prefixes_not_counted_when_off_or_for_baselines(make_router, make_snapshot, settings):
    router = make_router(**settings)
    assert router.in_flight is None
    router.cost_model = FixedCostModel(queue_s=[0.0, 0.5], prefill_s=[0.1, 0.1])
    router.route(request(1536, [1, 2, 3]), [make_snapshot(0), make_snapshot(1)], 1.0)
    queued = make_snapshot(0, waiting_prefill=((1536, 0),))
    decision = router.route(request(2560, [1, 2, 3, 4, 5], 1), [queued, make_snapshot(1)], 1.1)
    assert decision.reusable_tokens.tolist() == [0, 0]


def test_a_scorer_reads_the_routers_in_flight_prefixes_and_adds_none(make_router, make_snapshot):
    router = make_router()
    scorer = Router(router.directory, router.step_models, RouterSettings(), reads_from=router)
    scorer.cost_model = FixedCostModel(queue_s=[0.0, 0.5], prefill_s=[0.1, 0.1])
    scorer.route(request(1536, [7, 8]), [make_snapshot(0), make_snapshot(1)], 1.0)
    assert len(router.in_flight) == 0  # scoring left no trace
    router.cost_model = scorer.cost_model
    router.route(request(1536, [1, 2, 3]), [make_snapshot(0), make_snapshot(1)], 1.0)  # turn 1, to worker 0
    turn_2 = request(2560, [1, 2, 3, 4, 5], 1)
    assert scorer.route(turn_2, [make_snapshot(0), make_snapshot(1)], 1.1).reusable_tokens.tolist() == [1536, 0]
    assert len(router.in_flight) == 1


class LearnedFixedCostModel(FixedCostModel):
    """``FixedCostModel`` that calibrates: P50 = the composed TTFT, P90 = twice it."""

    learned = calibrated = True

    def calibrate(self, predictions):
        return CalibratedTTFT(predictions.ttft_s, 2.0 * predictions.ttft_s)


def test_served_p90_bounds_adapt_to_outcomes(make_router, make_snapshot):
    router = make_router(policy="learned_cost_aware")
    router.cost_model = LearnedFixedCostModel(queue_s=[0.1, 0.2], prefill_s=[0.0, 0.0])
    snaps = [make_snapshot(0), make_snapshot(1)]
    first = router.route(request(100, [], 1), snaps, 0.0)
    assert first.calibrated.p90_s.tolist() == [0.2, 0.4]  # factor 1 before any outcome
    router.on_outcome(1, ttft_s=0.3, now_s=1.0)  # above its 0.2 s bound: a miss, θ = 0.05 × 0.9
    router.on_outcome(99, ttft_s=9.0, now_s=1.0)  # never routed: ignored
    second = router.route(request(100, [], 2), snaps, 2.0)
    assert second.calibrated.p90_s.tolist() == pytest.approx([0.2 * math.exp(0.045), 0.4 * math.exp(0.045)])
    assert second.calibrated.p50_s.tolist() == [0.1, 0.2] and router.interval.updates == 1


def test_a_routed_request_past_its_bound_moves_the_factor_at_the_next_decision(make_router, make_snapshot):
    router = make_router(policy="learned_cost_aware")
    router.cost_model = LearnedFixedCostModel(queue_s=[0.1, 0.2], prefill_s=[0.0, 0.0])
    snaps = [make_snapshot(0), make_snapshot(1)]
    router.route(request(100, [], 1), snaps, 0.0)  # served 0.2 s on worker 0
    second = router.route(request(100, [], 2), snaps, 1.0)  # request 1 has waited 1 s with no first token
    assert second.calibrated.p90_s.tolist() == pytest.approx([0.2 * math.exp(0.045), 0.4 * math.exp(0.045)])
    router.on_outcome(1, ttft_s=1.2, now_s=1.2)  # counted already
    assert router.interval.updates == 1


def test_in_flight_entry_leaves_with_its_requests_outcome_not_with_the_directorys_store(make_router, make_snapshot):
    directory = CacheDirectory()
    router = make_router(directory, count_in_flight=True)
    router.cost_model = FixedCostModel(queue_s=[0.0, 0.5], prefill_s=[0.1, 0.1])
    router.route(request(1536, [1, 2, 3]), [make_snapshot(0), make_snapshot(1)], 1.0)
    router.route(request(1536, [1, 2, 3], 1), [make_snapshot(0), make_snapshot(1)], 1.01)
    directory.apply_stored(NS, 0, [1, 2, 3], parent_hash=None, tier="gpu", now_s=1.05)  # request 0's prefill
    router.route(request(2560, [1, 2, 3, 4, 5], 2), [make_snapshot(0), make_snapshot(1)], 1.1)
    assert len(router.in_flight) == 2  # request 1 is still queued with [1, 2, 3]; request 2 with [1..5]
    router.on_outcome(0, ttft_s=0.1, now_s=1.1)
    router.on_outcome(1, ttft_s=0.2, now_s=1.21)
    assert len(router.in_flight) == 1
    assert router.in_flight.match(NS, [1, 2, 3, 4, 5], [0]) == [5]


@pytest.mark.parametrize(
    ("min_ttl_s", "second_at_s", "blocks"), [(0.0, 1.19, 3), (0.0, 1.2, 0), (5.0, 5.99, 3), (5.0, 6.0, 0)]
)
def test_in_flight_entry_expires_after_twice_its_predicted_ttft_or_the_minimum(
    make_router, make_snapshot, min_ttl_s, second_at_s, blocks
):
    # turn 1 routed at 1.0 s with predicted TTFT 0.1 s: forgotten at 1.0 + max(2 × 0.1, min_ttl_s)
    router = make_router(count_in_flight=True, in_flight_min_ttl_s=min_ttl_s)
    decision = route_turns(router, make_snapshot, second_at_s)
    assert decision.matches[0].reusable_blocks == blocks


def test_in_flight_entry_of_a_caller_that_reports_outcomes_stays_until_its_outcome_without_a_ttft(
    make_router, make_snapshot
):
    # the gateway: turn 1 (blocks 1..3, request 0) is kept 100 s however short its predicted TTFT, until its
    # outcome: a failure before the first token drops it at once; a whole (unstreamed) answer after the grace
    router = make_router(count_in_flight=True, in_flight_release_grace_s=1.0)
    router.cost_model = FixedCostModel(queue_s=[0.0, 0.5], prefill_s=[0.1, 0.1])
    both = [make_snapshot(0), make_snapshot(1)]
    router.route(request(1536, [1, 2, 3]), both, 1.0, in_flight_ttl_s=100.0)
    router.route(request(1536, [7, 8], 1), both, 1.0, in_flight_ttl_s=100.0)
    held = router.route(request(2560, [1, 2, 3, 4, 5], 2), both, 50.0)
    assert held.matches[0].reusable_blocks == 3
    assert held.worker_id == 0
    for request_id in (0, 2):  # their engine failed
        router.release_in_flight(request_id, stored=False, now_s=50.0)
    router.release_in_flight(1, stored=True, now_s=50.0)  # answered whole
    assert router.in_flight.match(NS, [1, 2, 3], [0]) == [0]
    router.in_flight.expire(50.99)
    assert router.in_flight.match(NS, [7, 8], [0]) == [2]
    router.in_flight.expire(51.0)
    assert router.in_flight.match(NS, [7, 8], [0]) == [0]
    router.release_in_flight(99, stored=False, now_s=51.0)  # an unknown id: nothing


def test_a_negative_in_flight_minimum_is_refused():
    with pytest.raises(ValueError, match="in_flight_min_ttl_s = -1, expected a number ≥ 0"):
        RouterSettings(in_flight_min_ttl_s=-1)


def test_in_flight_prefixes_count_none_on_an_unreachable_engine_and_are_forgotten_on_a_restart(
    make_router, make_snapshot
):
    directory = CacheDirectory()
    router = make_router(directory, count_in_flight=True)
    router.cost_model = FixedCostModel(queue_s=[0.0, 0.5], prefill_s=[0.1, 0.1])
    router.route(request(1536, [1, 2, 3]), [make_snapshot(0), make_snapshot(1)], 1.0)  # to worker 0
    snaps = [make_snapshot(0), make_snapshot(1)]
    directory.mark_unknown(0)  # the engine stopped answering: what was sent there will not be stored
    assert router.route(request(2560, [1, 2, 3, 4], 1), snaps, 1.1).reusable_tokens.tolist() == [0, 0]
    directory.mark_known(0)  # the same process answers again: its requests (blocks 1-4, both sent there) still run
    assert router.route(request(2560, [1, 2, 3, 4], 2), snaps, 1.2).reusable_tokens.tolist() == [2048, 0]
    directory.clear_worker(0, now_s=1.3)  # a new process: every entry routed to worker 0 is dropped
    assert router.route(request(2560, [1, 2, 3, 4], 3), snaps, 1.4).reusable_tokens.tolist() == [0, 0]
    assert directory.clears(0) == 1 and directory.clears(1) == 0


def test_finished_requests_set_the_decode_length_the_features_and_the_policy_see(make_router, make_snapshot):
    # prior 10 tokens (mean 10.5, weight 100), window 1000 completions; one 1001-token completion:
    # Σ w = 0.999 × 100 + 1 = 100.9, Σ L = 0.999 × 1050 + 1001 = 2049.95, Σ L² = 0.999 × 22050 + 1001²
    # = 1024028.95: the policy's remaining output r = (Σ L² − Σ L) / (2 Σ L) = 1021979 / 4099.9, the
    # features' mean output Σ L / Σ w = 2049.95 / 100.9 (10, the settings' figure, before any completion)
    router = make_router(costs=NominalCosts(expected_decode_tokens=10))
    scorer = Router(router.directory, router.step_models, RouterSettings(), reads_from=router)
    seen = []
    choose = router.policy.choose
    router.policy.choose = lambda ctx: seen.append(ctx.remaining_decode_tokens) or choose(ctx)
    # KV one block short (4 blocks, 2 held by one decoder): the 3-block request waits for memory, and
    # the KV-wait estimate is one decoder's lifetime in decode steps, so it scales with the mean output
    full = [make_snapshot(0, running_requests=1, decode_context_tokens=512, kv_usage=0.5, kv_capacity_blocks=4)]
    column = FEATURE_NAMES.index("kv_wait_estimate_s")
    before = router.route(request(1536, [1, 2, 3]), full, 0.0).features[0, column]
    scorer.on_finished(5)  # a scorer reads the estimate and changes nothing
    router.on_finished(1001)
    after = router.route(request(1536, [1, 2, 3], 1), full, 1.0).features[0, column]
    assert seen == [pytest.approx(10.0, rel=1e-12), pytest.approx(1021979 / 4099.9, rel=1e-12)]
    assert scorer.decode_lengths is router.decode_lengths
    assert after / before == pytest.approx(2049.95 / 100.9 / 10, rel=1e-12)
    with pytest.raises(ValueError, match="output_tokens = -3, expected an integer ≥ 0"):
        router.on_finished(-3)
    # the decoder's progress known (3 tokens out): its finish follows the gamma of the observed mean
    # and spread instead of the stationary mean lifetime
    lengths = router.decode_lengths
    progress = [replace(full[0], running_output_tokens=(3,))]
    known = router.route(request(1536, [1, 2, 3], 2), progress, 2.0).features[0, column]
    expected = finish_steps(1, [3], lengths.mean_tokens, lengths.squared_cv) / lengths.mean_tokens
    assert known / after == pytest.approx(expected, rel=1e-9)
    assert lengths.squared_cv != pytest.approx(1.0)  # a spread of its own, not the exponential's


def test_a_promise_on_a_worker_short_of_memory_is_expected_to_be_partly_evicted(make_router, make_snapshot):
    """Worker 0 holds blocks 1..16 with 80 of its 100 blocks held by running requests and 40 queued: the
    request (17 blocks, 1 new) meets a deficit of 41 − 20 = 21 blocks, so 16 × 21/80 = 4.2 → 4 blocks of its
    promise are expected lost; without the pressure, or with ``count_promise_survival`` off, none."""
    pressed = make_snapshot(0, kv_capacity_blocks=100, kv_usage=0.8, waiting_prompt_blocks=40)
    idle = make_snapshot(0, kv_capacity_blocks=100)
    other = make_snapshot(1, kv_capacity_blocks=100)
    decision = make_router(hot_directory()).route(request(8704, range(1, 18)), [pressed, other], 0.0)
    assert decision.reusable_tokens.tolist() == [8192, 0]
    assert decision.expected_reuse_tokens.tolist() == [8192 - 4 * 512, 0]
    assert decision.queued_reuse_tokens() == [8192 - 4 * 512, 0][decision.chosen_index]
    decision = make_router(hot_directory()).route(request(8704, range(1, 18)), [idle, other], 0.0)
    assert decision.expected_reuse_tokens.tolist() == [8192, 0]
    off = make_router(hot_directory(), count_promise_survival=False)
    decision = off.route(request(8704, range(1, 18)), [pressed, other], 0.0)
    assert decision.expected_reuse_tokens is None
    assert decision.queued_reuse_tokens() == [8192, 0][decision.chosen_index]


def test_an_in_flight_prefix_keeps_its_requests_predicted_first_token(make_router, make_snapshot):
    """Per block, the latest predicted first token of the in-flight requests holding it."""
    router = make_router()
    router.cost_model = FixedCostModel(queue_s=[0.0, 0.5], prefill_s=[0.1, 0.1])
    router.route(request(1536, [1, 2, 3]), [make_snapshot(0), make_snapshot(1)], 1.0)
    assert router.in_flight.first_token_s(NS, 0, 3) == pytest.approx(1.1)
    queued = make_snapshot(0, waiting_prefill=((1536, 0),))
    router.route(request(2560, [1, 2, 3, 4, 5], 1), [queued, make_snapshot(1)], 1.05)
    assert [router.in_flight.first_token_s(NS, 0, b) for b in (3, 5)] == pytest.approx([1.15, 1.15])
    assert router.in_flight.first_token_s(NS, 1, 3) is None
