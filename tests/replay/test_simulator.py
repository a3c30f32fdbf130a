"""Tests for kvcost.replay.simulator.ClusterSimulator through ``run(trace)`` and ReplayResult."""

import math

import numpy as np
import pandas as pd
import pytest

from kvcost.core.hardware import GpuSpec, StepTimeModel
from kvcost.core.links import LinkSpec
from kvcost.core.types import ReusePlan, RouteDecision
from kvcost.data.traces import Trace, TraceRequest
from kvcost.replay.config import ClusterConfig
from kvcost.replay.metrics import summarise
from kvcost.replay.sim_request import SimRequest
from kvcost.replay.simulator import ClusterSimulator, ReplayResult, _promise_tokens
from kvcost.replay.tiers import TierConfig
from kvcost.routing.router import Router, RouterSettings
from tests.helpers import MS_PER_TOKEN_PROFILE, UNIT_MODEL

BLOCK = 16
TERM_COLUMNS = ["actual_queue_s", "actual_lookup_s", "actual_transfer_s", "actual_prefill_s", "actual_first_token_s"]


def make_trace(requests, block_size_tokens: int = BLOCK) -> Trace:
    """``requests``: (arrival_s, input_tokens, output_tokens, block_hashes); ids are the list index."""
    rows = tuple(TraceRequest(i, float(t), n_in, n_out, tuple(h)) for i, (t, n_in, n_out, h) in enumerate(requests))
    return Trace(
        name="tiny",
        source="test",
        loader="mooncake",
        block_size_tokens=block_size_tokens,
        requests=rows,
        skipped_lines=0,
        spread_bucket_s=None,
        rate_scale=1.0,
        start_s=0.0,
        duration_s=None,
    )


def blocks(prefix: range, unique_start: int, input_tokens: int, block: int = BLOCK) -> tuple[int, ...]:
    """``ceil(input / block)`` hashes: the shared ``prefix`` ids, then fresh ids from ``unique_start``."""
    n = -(-input_tokens // block)
    shared = list(prefix)[:n]
    return tuple(shared) + tuple(range(unique_start, unique_start + n - len(shared)))


def run(trace: Trace, **config) -> ReplayResult:
    settings = dict(fleet=("a100",), jitter_sigma=0.0) | config
    return ClusterSimulator(ClusterConfig(**settings), trace.block_size_tokens).run(trace)


def busy_trace() -> Trace:
    """10 requests in 0.45 s, half behind a shared 60-block system prompt: queues build up."""
    system = range(1, 61)
    reqs = []
    for i, (n_in, n_out) in enumerate(
        [
            (2000, 40),
            (3100, 20),
            (1500, 60),
            (4000, 30),
            (2600, 50),
            (5200, 10),
            (1800, 80),
            (3300, 25),
            (6000, 15),
            (2200, 45),
        ]
    ):
        prefix = system if i % 2 == 0 else range(0)
        reqs.append((0.05 * i, n_in, n_out, blocks(prefix, 1000 * (i + 1), n_in)))
    return make_trace(reqs)


def test_trace_block_size_must_match():
    sim = ClusterSimulator(ClusterConfig(fleet=("a100",)), 32)
    with pytest.raises(ValueError) as err:
        sim.run(make_trace([]))
    assert str(err.value) == "trace block_size_tokens = 16, expected 32"


# -- exact times with a hand-made step model ------------------------------------------------
UNIT_GPU = GpuSpec(name="a100", memory_bytes=2**30, peak_dense_bf16_flops=4e6, hbm_bytes_per_s=4e5)
UNIT_PROFILE = MS_PER_TOKEN_PROFILE


@pytest.fixture
def unit_steps(monkeypatch):
    """Step = 1 ms × tokens + 1 µs × prefill pairs + 10 µs × decode context + 1 ms (as in test_worker).

    The simulator's workers use the default costs: lookup 0.2 ms + 10 µs per full block, F = 2 ms.
    """

    def unit_for_hardware(cls, model_name, gpu_name, **settings):
        return cls(
            UNIT_MODEL,
            UNIT_GPU,
            UNIT_PROFILE,
            attention_flops_efficiency=1.0,
            decode_bandwidth_efficiency=1.0,
            step_overhead_s=1e-3,
            **settings,
        )

    monkeypatch.setattr(StepTimeModel, "for_hardware", classmethod(unit_for_hardware))


def test_exact_terms_with_a_hand_made_step_model(unit_steps):
    trace = make_trace([(1.0, 45, 3, (1, 2, 3, 4, 5)), (5.0, 52, 1, (1, 2, 3, 7, 8, 9))], block_size_tokens=10)
    result = run(trace, token_budget=100, kv_capacity_blocks=100, sample_interval_s=10.0)
    req = result.requests
    assert req["request_id"].tolist() == [0, 1]
    assert req["worker_id"].tolist() == [0, 0]
    assert req["predicted_reuse_tokens"].tolist() == [0, 30]
    assert req["actual_reuse_tokens"].tolist() == [0, 30]
    assert req["directory_mismatch_tokens"].tolist() == [0, 0]
    expected = {
        # request 0: 45 tokens from scratch: 45 ms + 45 × 23 µs + 1 ms; 4 full blocks looked up
        "actual_queue_s": [0.0, 0.0],
        "actual_lookup_s": [0.00024, 0.00025],
        "actual_transfer_s": [0.0, 0.0],
        # request 1: 22 tokens after 30 reused: 22 ms + 22 × 41.5 µs + 1 ms
        "actual_prefill_s": [0.047035, 0.023913],
        "actual_first_token_s": [0.002, 0.002],
        "actual_ttft_s": [0.049275, 0.026163],
        # 2 decode steps at context 46 and 47: 2 ms + 0.46 ms and 2 ms + 0.47 ms
        "tpot_s": [0.004930 / 2, math.nan],
        "e2e_s": [0.049275 + 0.00493, 0.026163],
    }
    for column, values in expected.items():
        assert req[column].tolist() == pytest.approx(values, abs=1e-12, nan_ok=True), column
    # idle worker, no jitter: the analytic prediction is the actual time, term by term
    for term in ("queue", "lookup", "transfer", "prefill", "first_token", "ttft"):
        assert req[f"pred_{term}_s"].tolist() == pytest.approx(req[f"actual_{term}_s"].tolist(), abs=1e-12)
    assert result.makespan_s == pytest.approx(5.026163 - 2e-3 - 1.0, abs=1e-12)
    assert result.candidates["request_id"].tolist() == [0, 1]
    assert result.candidates["chosen"].tolist() == [True, True]
    assert result.worker_samples["t_s"].tolist() == [0.0]  # the next sample (10 s) is after the last event


def test_the_router_learns_a_ttft_at_the_first_token_not_at_completion(unit_steps, monkeypatch):
    outcomes = []
    monkeypatch.setattr(Router, "on_outcome", lambda self, rid, ttft_s, now_s: outcomes.append((rid, ttft_s, now_s)))
    trace = make_trace([(1.0, 45, 3, (1, 2, 3, 4, 5))], block_size_tokens=10)
    result = run(trace, token_budget=100, kv_capacity_blocks=100, sample_interval_s=10.0)
    # the prefill step ends at 1 + 0.24 ms lookup + 47.035 ms; the request finishes 4.93 ms of decode later
    assert outcomes == [(0, pytest.approx(0.049275, abs=1e-12), pytest.approx(1.047275, abs=1e-12))]
    assert result.requests["e2e_s"].tolist() == pytest.approx([0.049275 + 0.00493], abs=1e-12)


def test_the_router_learns_each_output_length_when_its_request_finishes(unit_steps, monkeypatch):
    finished = []
    monkeypatch.setattr(Router, "on_finished", lambda self, output_tokens: finished.append(output_tokens))
    trace = make_trace([(1.0, 45, 3, (1, 2, 3, 4, 5)), (1.0, 25, 7, (6, 7, 8))], block_size_tokens=10)
    run(trace, token_budget=100, kv_capacity_blocks=100, sample_interval_s=10.0)
    assert finished == [3, 7]  # the shorter output finishes first


# -- TTFT composition and determinism on real profiles ---------------------------------------
def test_actual_terms_sum_to_ttft_for_every_request():
    result = run(busy_trace(), fleet=("a100", "h100"))
    req = result.requests
    assert req["request_id"].tolist() == list(range(10))
    assert (req["actual_queue_s"] > 0).sum() >= 3  # the case is not trivially idle
    assert req["actual_reuse_tokens"].sum() > 0
    assert set(req["worker_id"]) == {0, 1}
    assert (req["actual_transfer_s"] == 0.0).all()
    total = req[TERM_COLUMNS].sum(axis=1).to_numpy()
    np.testing.assert_allclose(total, req["actual_ttft_s"].to_numpy(), rtol=0, atol=1e-12)
    assert (req[TERM_COLUMNS] >= 0).all().all()


def test_same_seed_same_result_other_seed_other_times():
    config = dict(fleet=("a100", "h100"), jitter_sigma=0.1)
    first = run(busy_trace(), seed=7, **config)
    second = run(busy_trace(), seed=7, **config)
    pd.testing.assert_frame_equal(first.requests, second.requests)
    pd.testing.assert_frame_equal(first.candidates, second.candidates)
    pd.testing.assert_frame_equal(first.worker_samples, second.worker_samples)
    np.testing.assert_array_equal(first.utilisation, second.utilisation)
    assert first.makespan_s == second.makespan_s

    other = run(busy_trace(), seed=8, **config)
    assert other.requests["request_id"].tolist() == first.requests["request_id"].tolist()
    assert not np.array_equal(other.requests["actual_ttft_s"], first.requests["actual_ttft_s"])
    # jitter is ground truth only: the sums still compose
    total = other.requests[TERM_COLUMNS].sum(axis=1).to_numpy()
    np.testing.assert_allclose(total, other.requests["actual_ttft_s"].to_numpy(), rtol=0, atol=1e-12)


# -- directory lag ------------------------------------------------------------------------------
def eviction_trace() -> Trace:
    """One worker of 4 KV blocks (16 tokens each).

    t=0: request 0 stores blocks 1, 2 (its prompt; one output token needs no more), finishes: idle [2, 1].
    t=10: request 1's 60-token prompt needs 4 blocks: evicts 2 and 1, stores 3, 4, 5.
    t=20: request 2 asks for 1, 2: gone. A directory that already heard of the store
    (t≈0 + lag) but not yet of the eviction (10 + lag) promises 2 blocks = 32 tokens.
    """
    return make_trace([(0.0, 32, 1, (1, 2)), (10.0, 60, 1, (3, 4, 5, 7)), (20.0, 40, 1, (1, 2, 6))])


@pytest.mark.parametrize(
    ("lag_s", "predicted", "mismatch"), [(0.0, [0, 0, 0], [0, 0, 0]), (15.0, [0, 0, 32], [0, 0, 32])]
)
def test_directory_lag_promises_an_evicted_prefix(lag_s, predicted, mismatch):
    req = run(eviction_trace(), kv_capacity_blocks=4, directory_lag_s=lag_s).requests
    assert req["predicted_reuse_tokens"].tolist() == predicted
    assert req["actual_reuse_tokens"].tolist() == [0, 0, 0]
    assert req["directory_mismatch_tokens"].tolist() == mismatch
    # the promised hit falls back to recompute; the log prices it at the profile's prefill time
    a100 = StepTimeModel.for_hardware("llama-3-8b", "a100")
    lost_s = [a100.prefill_alone_s(m, 0) if m else 0.0 for m in mismatch]
    assert req["mismatch_lost_s"].tolist() == pytest.approx(lost_s)
    assert req["served_by"].tolist() == ["recompute"] * 3


def test_directory_lag_hides_a_stored_prefix_without_a_mismatch():
    # request 1 reuses request 0's 2 blocks; with a 15 s lag the router has not heard of them yet
    trace = make_trace([(0.0, 32, 1, (1, 2)), (5.0, 48, 1, (1, 2, 3))])
    fresh = run(trace, directory_lag_s=0.0).requests
    late = run(trace, directory_lag_s=15.0).requests
    assert fresh["predicted_reuse_tokens"].tolist() == [0, 32]
    assert late["predicted_reuse_tokens"].tolist() == [0, 0]
    assert fresh["actual_reuse_tokens"].tolist() == late["actual_reuse_tokens"].tolist() == [0, 32]
    # a mismatch counts only promised reuse that was not there, not unexpected reuse
    assert fresh["directory_mismatch_tokens"].tolist() == late["directory_mismatch_tokens"].tolist() == [0, 0]


# -- cache off ------------------------------------------------------------------------------------
def reuse_trace() -> Trace:
    # 1 then 2 reuse request 0's first 2 blocks; request 2 is fully cached (all but its last token)
    return make_trace([(0.0, 48, 1, (1, 2, 3)), (5.0, 50, 1, (1, 2, 4, 5)), (6.0, 48, 1, (1, 2, 3))])


def test_cache_on_reuses_exact_prefixes():
    req = run(reuse_trace()).requests
    assert req["predicted_reuse_tokens"].tolist() == [0, 32, 47]
    assert req["actual_reuse_tokens"].tolist() == [0, 32, 47]
    assert req["directory_mismatch_tokens"].tolist() == [0, 0, 0]


def test_the_log_splits_a_promise_into_stored_and_in_flight():
    # request 0 fills the first step; request 1 (a 250-block prompt) queues behind it, and request 2,
    # of the same family, arrives before request 1 is scheduled: the router promises request 1's
    # blocks from its in-flight index (the directory has none yet). Both are scheduled in the next
    # step, request 1 first, whose blocks are cached as the step is formed (vLLM's allocate_slots),
    # so request 2 finds them. Request 3 finds them stored.
    system = range(1, 251)
    trace = make_trace(
        [
            (0.0, 8000, 1, blocks(range(5000, 5500), 5000, 8000)),
            (0.001, 4000, 1, blocks(system, 1000, 4000)),
            (0.002, 4032, 1, blocks(system, 2000, 4032)),
            (30.0, 4032, 1, blocks(system, 3000, 4032)),
        ]
    )
    result = run(trace)
    req = result.requests
    assert req["predicted_reuse_tokens"].tolist() == [0, 0, 4000, 4000]
    assert req["directory_reuse_tokens"].tolist() == [0, 0, 0, 4000]
    assert req["actual_reuse_tokens"].tolist() == [0, 0, 4000, 4000]
    summary = summarise(result, n_workers=1)
    assert (summary["promised_in_flight_share"], summary["in_flight_recomputed_share"]) == (0.5, 0.0)


@pytest.mark.parametrize(
    ("plan", "directory_blocks", "expected"),
    [
        (None, (1, 2), (40, 32)),  # the directory holds 2 blocks (32 tokens): 8 of the 40 promised were in flight
        (ReusePlan("local", gpu_blocks=3), (1, 2), (40, 32)),
        (ReusePlan("fetch", gpu_blocks=0, fetch_blocks=3, source_id=0), (1, 0), (40, 40)),  # stored at the source
    ],
)
def test_promise_tokens_split_the_promise_into_stored_and_in_flight(plan, directory_blocks, expected):
    decision = RouteDecision(
        request_id=0,
        worker_id=1,
        chosen_index=1,
        worker_ids=(0, 1),
        reason="",
        matches=(),
        reusable_tokens=np.array([0, 40]),
        features=np.zeros((2, 1)),
        predictions=None,
        plans=() if plan is None else (ReusePlan("local", gpu_blocks=0), plan),
        directory_blocks=directory_blocks,
    )
    assert _promise_tokens(decision, input_tokens=41, block_size_tokens=BLOCK) == expected


def test_cache_off_means_no_reuse_and_no_mismatch():
    for trace in (reuse_trace(), eviction_trace()):
        req = run(trace, cache_enabled=False, kv_capacity_blocks=4, directory_lag_s=15.0).requests
        assert req["predicted_reuse_tokens"].tolist() == [0, 0, 0]
        assert req["actual_reuse_tokens"].tolist() == [0, 0, 0]
        assert req["directory_mismatch_tokens"].tolist() == [0, 0, 0]
    busy = run(busy_trace(), fleet=("a100", "h100"), cache_enabled=False).requests
    assert len(busy) == 10
    assert (busy["actual_reuse_tokens"] == 0).all() and (busy["predicted_reuse_tokens"] == 0).all()
    assert (busy["directory_mismatch_tokens"] == 0).all()

    # no worker reports stored blocks, so the directory offers no candidate any reuse
    candidates = run(busy_trace(), fleet=("a100", "h100"), cache_enabled=False).candidates
    assert len(candidates) == 20 and (candidates["reusable_tokens"] == 0).all()


def test_round_robin_alternates_workers():
    req = run(busy_trace(), fleet=("a100", "h100"), router=RouterSettings(policy="round_robin")).requests
    assert req["worker_id"].tolist() == [0, 1] * 5


def test_utilisation_is_a_fraction_with_warmup():
    # three 8000-token prompts in warm-up keep the worker busy ~2 s; one 16-token request is measured
    warm = [(0.0, 8000, 1, range(100 * i, 100 * i + 500)) for i in range(3)]
    trace = make_trace([*warm, (9.99, 16, 1, (9999,))])
    result = run(trace, warmup_s=5.0)
    assert len(result.requests) == 1
    assert 0.0 <= result.utilisation[0] <= 1.0


# -- transfers ------------------------------------------------------------------------------------
def test_a_fetch_moves_what_the_source_really_holds_and_a_stale_promise_moves_nothing():
    tiers = TierConfig(network=LinkSpec(1e9, 0.001))
    sim = ClusterSimulator(ClusterConfig(fleet=("a100", "a100"), jitter_sigma=0.0, tiers=tiers), BLOCK)
    source, target = sim.workers
    chain = (11, 12, 13)
    plan = ReusePlan("fetch", gpu_blocks=0, fetch_blocks=3, source_id=0)
    stale = SimRequest(0, 5.0, 3 * BLOCK + 1, 1, chain, 3 * BLOCK)
    assert not sim._fetch(target, stale, plan, now=5.0)  # the directory promised blocks the source lost
    assert stale.fetch_hashes == () and stale.transfer_s == 0.0
    source.tiers.put_cpu([11, 12])  # the source still holds the first two blocks (demoted to CPU)
    request = SimRequest(1, 5.0, 3 * BLOCK + 1, 1, chain, 3 * BLOCK)
    assert sim._fetch(target, request, plan, now=5.0)
    assert request.fetch_hashes == (11, 12)  # only what is there moves; block 13 will be recomputed
    block_bytes = target.tiers.block_bytes
    assert request.transfer_s == pytest.approx(0.001 + 2 * block_bytes / 1e9)
    assert request.served_by == "remote_transfer"


def test_a_tensor_parallel_fleet_of_a_70b_model_replays_with_the_groups_kv_capacity():
    trace = busy_trace()
    result = run(trace, fleet=("h100",), model="llama-2-70b", tensor_parallel=4)
    assert len(result.requests) == len(trace.requests) and result.rejected_requests == 0
    step_model = StepTimeModel.for_hardware("llama-2-70b", "h100", tp=4)
    sim = ClusterSimulator(ClusterConfig(fleet=("h100",), model="llama-2-70b", tensor_parallel=4), BLOCK)
    assert sim.workers[0].pool.capacity_blocks == step_model.kv_capacity_blocks(BLOCK) == 496503 // BLOCK


def test_the_growing_block_event_frame_equals_a_fresh_one_as_the_history_grows():
    from types import SimpleNamespace

    from kvcost.replay.simulator import _block_events, _GrowingBlockEvents

    pools = [SimpleNamespace(block_events=[]) for _ in range(2)]
    workers = [SimpleNamespace(worker_id=i, pool=pool) for i, pool in enumerate(pools)]
    growing = _GrowingBlockEvents(workers)
    pd.testing.assert_frame_equal(growing(), _block_events(workers))
    pools[0].block_events += [(0.5, 11, "store", 0, 2, 0), (0.5, 12, "store", 1, 2, 0)]
    pd.testing.assert_frame_equal(growing(), _block_events(workers))
    pools[1].block_events.append((1.0, 11, "hit", 0, 3, 1))
    pools[0].block_events.append((1.5, 12, "release", 1, 2, 0))
    frame = growing()
    pd.testing.assert_frame_equal(frame, _block_events(workers))
    assert frame["worker_id"].tolist() == [0, 0, 0, 1] and frame["t_s"].tolist() == [0.5, 0.5, 1.5, 1.0]
    pools[1].block_events.append((2.0, 2**63, "store", 0, 1, 0))  # past int64: uint64, converted whole again
    frame = growing()
    pd.testing.assert_frame_equal(frame, _block_events(workers))
    assert frame["block_hash"].tolist() == [11, 12, 12, 11, 2**63]
