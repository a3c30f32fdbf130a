"""Tests for kvcost.replay.worker.SimWorker (chunked prefill, FCFS admission, actual terms).

The step model is hand-made so every step time is a round number:

    step_s = 1 ms × batch tokens + 1 µs × prefill attention pairs + 10 µs × decode context + 1 ms

(prefill attention pairs for n new tokens after c context tokens: n × (c + (n + 1) / 2)).
Block size 10 tokens, budget 100 tokens per step. Lookup = 10 ms + 1 ms per full block;
first-token work = 5 ms.
"""

import math
from collections import deque

import pytest

from kvcost.core.hardware import GpuSpec, StepTimeModel
from kvcost.core.links import LinkSpec
from kvcost.core.types import blocks_to_allocate
from kvcost.features.nominal import NominalCosts
from kvcost.replay.kv_cache import BlockPool
from kvcost.replay.sim_request import SimRequest
from kvcost.replay.tiers import TierConfig, WorkerTiers
from kvcost.replay.worker import SimWorker, WorkerTruth
from tests.helpers import MS_PER_TOKEN_PROFILE, UNIT_MODEL

BLOCK = 10
# 4e6 FLOP/s → 1 µs per token pair; 4e5 B/s → 10 µs per decode context token
UNIT_GPU = GpuSpec(name="unit-gpu", memory_bytes=2**30, peak_dense_bf16_flops=4e6, hbm_bytes_per_s=4e5)
UNIT_PROFILE = MS_PER_TOKEN_PROFILE
COSTS = NominalCosts(lookup_base_s=0.01, lookup_per_block_s=0.001, first_token_s=0.005)


def unit_step_model(token_budget: int = 100) -> StepTimeModel:
    return StepTimeModel(
        UNIT_MODEL,
        UNIT_GPU,
        UNIT_PROFILE,
        token_budget=token_budget,
        attention_flops_efficiency=1.0,
        decode_bandwidth_efficiency=1.0,
        step_overhead_s=1e-3,
    )


def make_worker(capacity_blocks: int = 100, *, cache_enabled: bool = True, **truth) -> SimWorker:
    truth = dict(jitter_sigma=0.0, costs=COSTS) | truth
    return SimWorker(
        0, "unit-gpu", unit_step_model(), BlockPool(capacity_blocks, cache_enabled), BLOCK, WorkerTruth(**truth), seed=0
    )


def req(
    request_id: int, arrival_s: float, input_tokens: int, output_tokens: int, hashes, predicted_reuse_tokens: int = 0
) -> SimRequest:
    return SimRequest(request_id, arrival_s, input_tokens, output_tokens, tuple(hashes), predicted_reuse_tokens)


def drive(worker: SimWorker, requests: list[SimRequest]) -> list[SimRequest]:
    """One-worker event loop, as the simulator's: a step ending at t runs before an arrival at t."""
    pending = deque(sorted(requests, key=lambda r: r.arrival_s))
    done: list[SimRequest] = []
    while pending or worker.step_end_s is not None:
        t_step = worker.step_end_s if worker.step_end_s is not None else math.inf
        t_arrival = pending[0].arrival_s if pending else math.inf
        if t_step <= t_arrival:
            done += worker.finish_step(t_step)
            worker.start_step(t_step)
        else:
            request = pending.popleft()
            worker.enqueue(request)
            if worker.step_end_s is None or worker.idle_wait:
                worker.start_step(t_arrival)
    return done


def terms(r: SimRequest) -> tuple[float, float, float, float, float]:
    """(Q, L, X, P, F) as the worker's module docstring defines them."""
    return (
        r.queued_until_s - r.arrival_s,
        r.lookup_s,
        0.0,
        r.prefill_end_s - (r.queued_until_s + r.lookup_s),
        r.first_token_overhead_s,
    )


def approx(x):
    return pytest.approx(x, abs=1e-12, rel=0)


def test_one_request_on_an_idle_worker():
    worker = make_worker()
    r = req(0, 2.0, 45, 1, [1, 2, 3, 4, 5])  # 4 full blocks + a partial one
    assert drive(worker, [r]) == [r]
    # lookup 10 ms + 4 × 1 ms; step 45 tokens = 45 ms + 45 × 23 pairs × 1 µs + 1 ms
    assert r.admitted_s == 2.0
    assert r.lookup_s == approx(0.014)
    assert r.prefill_end_s == approx(2.0 + 0.014 + 0.045 + 0.001035 + 0.001)
    assert r.first_token_s == approx(2.061035 + 0.005)
    assert r.finish_s == r.prefill_end_s  # a single output token: done at prefill
    assert r.reused_tokens == 0
    q, lk, x, p, f = terms(r)
    assert (q, lk, x, p, f) == (0.0, approx(0.014), 0.0, approx(0.047035), 0.005)
    assert q + lk + x + p + f == approx(r.first_token_s - r.arrival_s)
    assert r.first_token_s - r.arrival_s == approx(0.066035)
    assert worker.step_end_s is None and worker.queued_prefill_tokens == 0
    assert worker.events == [(r.admitted_s, "stored", [1, 2, 3, 4], None, "gpu")]  # cached as the step is formed
    assert (worker.pool.used_blocks, worker.pool.eviction_order()) == (0, [4, 3, 2, 1])


def test_request_needing_two_chunks():
    worker = make_worker()
    r = req(0, 0.0, 150, 1, range(1, 16))
    drive(worker, [r])
    step1 = 0.1 + 100 * 50.5e-6 + 0.001 + 0.025  # 100 tokens from context 0, + lookup 10 + 15 ms
    step2 = 0.05 + 50 * 125.5e-6 + 0.001  # 50 tokens after 100 of context, no lookup
    assert (step1, step2) == (approx(0.13105), approx(0.057275))
    assert r.admitted_s == 0.0
    assert r.prefill_end_s == approx(0.188325)
    q, lk, x, p, f = terms(r)
    assert (q, lk, p) == (0.0, approx(0.025), approx(0.163325))
    assert q + lk + x + p + f == approx(r.first_token_s - r.arrival_s) == approx(0.193325)


def test_fcfs_second_request_waits_for_the_running_step():
    worker = make_worker()
    a = req(0, 0.0, 80, 1, range(1, 9))
    b = req(1, 0.01, 60, 1, range(11, 17))  # arrives mid-step: waits for the next one
    drive(worker, [b, a])
    # a: 80 ms + 80 × 40.5 µs + 1 ms + lookup 18 ms
    assert a.prefill_end_s == approx(0.10224)
    assert b.admitted_s == a.prefill_end_s
    # b: 60 ms + 60 × 30.5 µs + 1 ms + lookup 16 ms
    assert b.prefill_end_s == approx(0.10224 + 0.07883)
    q, lk, x, p, f = terms(b)
    assert (q, lk, p, f) == (approx(0.09224), approx(0.016), approx(0.06283), 0.005)
    assert q + lk + x + p + f == approx(b.first_token_s - b.arrival_s) == approx(0.17607)


def test_fcfs_shares_the_token_budget_in_one_step():
    worker = make_worker()
    a = req(0, 0.0, 80, 1, range(1, 9))
    b = req(1, 0.0, 60, 1, range(11, 17))
    worker.enqueue(a)
    worker.enqueue(b)  # both wait when the step is formed
    worker.start_step(0.0)
    drive(worker, [])
    # step 1: a's 80 tokens + b's first 20 (FCFS chunking); lookup is the larger of the two (18 ms)
    step1 = 0.1 + (80 * 40.5 + 20 * 10.5) * 1e-6 + 0.001 + 0.018
    # step 2: b's last 40 tokens after 20 of context
    step2 = 0.04 + 40 * 40.5e-6 + 0.001
    assert (step1, step2) == (approx(0.12245), approx(0.04262))
    assert a.prefill_end_s == approx(0.12245)
    assert b.admitted_s == 0.0 and b.prefill_end_s == approx(0.16507)
    q, lk, x, p, f = terms(b)
    assert (q, lk, p) == (0.0, approx(0.016), approx(0.14907))  # P absorbs a's longer lookup
    assert q + lk + x + p + f == approx(b.first_token_s - b.arrival_s) == approx(0.17007)


def test_decode_finishes_after_output_tokens_minus_one_steps():
    worker = make_worker()
    r = req(0, 0.0, 45, 4, [1, 2, 3, 4, 5])
    drive(worker, [r])
    assert r.prefill_end_s == approx(0.061035)
    # 3 decode steps of 1 token: 1 ms + 10 µs × context (46, 47, 48) + 1 ms
    assert r.finish_s == approx(0.061035 + 0.00246 + 0.00247 + 0.00248)
    assert worker.decode_steps == 3 and worker.decode_context_tokens == 0
    assert worker.running_requests == 0 and worker.pool.used_blocks == 0


def test_prefix_reuse_after_the_first_request_finished():
    worker = make_worker()
    a = req(0, 0.0, 45, 1, [1, 2, 3, 4, 5])
    b = req(1, 1.0, 52, 1, [1, 2, 3, 7, 8, 9])  # shares blocks 1-3 with a
    drive(worker, [a, b])
    assert b.reused_tokens == 30 and b.allocation is not None and b.allocation.reused_blocks == 3
    # 22 tokens after 30 of context: 22 ms + 22 × 41.5 µs + 1 ms; lookup 10 + 5 ms
    assert b.lookup_s == approx(0.015)
    assert b.prefill_end_s == approx(1.0 + 0.015 + 0.022 + 0.000913 + 0.001)
    assert worker.events[-1] == (b.admitted_s, "stored", [7, 8], 3, "gpu")  # cached as the step is formed
    assert worker.pool.eviction_order() == [4, 8, 7, 3, 2, 1]


def test_fully_cached_prompt_still_computes_its_last_token():
    worker = make_worker()
    a = req(0, 0.0, 40, 1, [1, 2, 3, 4])
    b = req(1, 1.0, 40, 1, [1, 2, 3, 4])
    drive(worker, [a, b])
    assert b.reused_tokens == 39
    # 1 token after 39 of context: 1 ms + 40 µs + 1 ms; lookup 14 ms
    assert b.prefill_end_s == approx(1.0 + 0.014 + 0.001 + 0.00004 + 0.001)
    assert len(worker.events) == 1  # b stored nothing new


def test_admission_blocked_while_kv_is_full_resumes_after_a_finish():
    worker = make_worker(capacity_blocks=8)
    a = req(0, 0.0, 45, 20, [1, 2, 3, 4, 5])  # ceil(65 / 10) = 7 blocks
    b = req(1, 0.01, 55, 1, [11, 12, 13, 14, 15, 16])  # 6 blocks: does not fit while a runs
    c = req(2, 0.02, 5, 1, [21])  # 1 block would fit, but waits behind b (FCFS)
    drive(worker, [a, b, c])
    # a: prefill 61.035 ms, then 19 decode steps of 2 ms + 10 µs × context 46 … 64
    a_finish = 0.061035 + 19 * 0.002 + 1e-5 * sum(range(46, 65))
    assert a.finish_s == approx(a_finish) == approx(0.109485)
    assert b.admitted_s == a.finish_s and c.admitted_s == a.finish_s
    q, lk, x, p, f = terms(b)
    assert q == approx(0.099485)
    # b led the queue with budget to spare from the end of a's prefill step: that part of Q waited for KV
    assert (b.kv_wait_s, c.kv_wait_s) == (approx(0.109485 - 0.061035), 0.0)
    # b and c in one step: 60 tokens, pairs 55 × 28 + 5 × 3, lookup max(15, 10) ms
    assert b.prefill_end_s == approx(0.109485 + 0.06 + 0.006220 / 4 + 0.001 + 0.015)
    assert q + lk + x + p + f == approx(b.first_token_s - b.arrival_s)
    # a's 4 cached blocks went idle tail-first; b evicted 2 of them, c one more
    removed = [e for e in worker.events if e[1] == "removed"]
    assert removed == [(a.finish_s, "removed", [4, 3], None, "gpu"), (a.finish_s, "removed", [2], None, "gpu")]
    assert worker.pool.eviction_order() == [1, 15, 14, 13, 12, 11]


def test_snapshot_queue_accounting_uses_predicted_then_actual_reuse():
    worker = make_worker()
    r = req(0, 0.0, 45, 1, [1, 2, 3, 4, 5], predicted_reuse_tokens=20)
    worker.enqueue(r)
    snap = worker.snapshot(0.0)
    assert snap.waiting_prefill == ((25, 20),) and worker.queued_prefill_tokens == 25
    end = worker.start_step(0.0)  # admission finds no cached prefix: 45 tokens to compute
    assert worker.queued_prefill_tokens == 45
    snap = worker.snapshot(0.02)
    assert snap.waiting_prefill == ()  # all 45 tokens are in the running step: step_remaining_s covers them
    assert snap.step_remaining_s == approx(end - 0.02)
    worker.finish_step(end)
    assert worker.queued_prefill_tokens == 0 and worker.snapshot(end).waiting_prefill == ()


def test_slowdown_scales_compute_but_not_lookup():
    worker = make_worker(speed_fraction=0.5, slowdown_from_s=1.0)
    a = req(0, 0.0, 45, 1, [1, 2, 3, 4, 5])
    b = req(1, 1.0, 45, 1, [6, 7, 8, 9, 10])
    drive(worker, [a, b])
    assert a.prefill_end_s == approx(0.061035)
    assert b.prefill_end_s == approx(1.0 + 2 * 0.047035 + 0.014)


def test_jitter_is_seeded_per_worker():
    def first_step(seed: int, worker_id: int) -> float:
        w = SimWorker(
            worker_id,
            "unit-gpu",
            unit_step_model(),
            BlockPool(100),
            BLOCK,
            WorkerTruth(jitter_sigma=0.1, costs=COSTS),
            seed=seed,
        )
        w.enqueue(req(0, 0.0, 45, 1, [1, 2, 3, 4, 5]))
        return w.start_step(0.0)

    assert first_step(3, 0) == first_step(3, 0)
    assert first_step(3, 0) != first_step(4, 0)
    assert first_step(3, 0) != first_step(3, 1)
    assert first_step(3, 0) != approx(0.061035)


def test_snapshot_leaves_the_running_chunk_to_step_remaining():
    worker = make_worker()
    worker.enqueue(req(0, 0.0, 150, 1, range(1, 16)))
    end = worker.start_step(0.0)  # budget 100: the first chunk is 100 tokens
    snap = worker.snapshot(0.01)
    assert snap.waiting_prefill == ((50, 100),)
    assert snap.step_remaining_s == approx(end - 0.01)
    assert worker.queued_prefill_tokens == 150  # the sampled log still counts the running chunk


def test_fork_runs_forward_without_touching_the_original():
    worker = make_worker(jitter_sigma=0.1)
    busy = req(0, 0.0, 150, 5, range(1, 16))
    worker.enqueue(busy)
    worker.start_step(0.0)
    before = (worker.step_end_s, worker.queued_prefill_tokens, list(worker._jitter), worker.pool.free_blocks)
    probe = req(1, 0.01, 45, 3, range(100, 105))
    first_token_s = worker.fork().run_until_first_token(probe, 0.01)
    assert (worker.step_end_s, worker.queued_prefill_tokens, list(worker._jitter), worker.pool.free_blocks) == before
    assert busy.computed_tokens == 0 and not math.isnan(probe.admitted_s)
    # the same request really enqueued on the original gets exactly the forecast first token
    real = req(1, 0.01, 45, 3, range(100, 105))
    assert drive_from(worker, real) == first_token_s


def drive_from(worker: SimWorker, request: SimRequest) -> float:
    worker.enqueue(request)
    while math.isnan(request.prefill_end_s):
        end = worker.step_end_s
        worker.finish_step(end)
        worker.start_step(end)
    return request.first_token_s


def test_run_until_first_token_is_inf_when_never_admitted():
    worker = make_worker(capacity_blocks=3)
    assert worker.fork().run_until_first_token(req(0, 0.0, 45, 1, range(1, 6)), 0.0) == math.inf


def test_lower_tier_hits_are_loaded_in_lookup_and_queue_on_the_pcie_link():
    # 1 block = 10 tokens × 4 B = 40 B; PCIe at 400 B/s → 0.1 s per block, no setup
    config = TierConfig(cpu_bytes=400, disk_bytes=0, remote_bytes=0, cpu_to_gpu=LinkSpec(400.0, 0.0))
    worker = make_worker()
    worker.tiers = WorkerTiers(config, block_bytes=40)
    worker.tiers.put_cpu([1, 2])  # demoted earlier: in CPU, not in GPU
    a, b = req(0, 0.0, 25, 2, (1, 2)), req(1, 0.0, 25, 2, (1, 2))
    worker.enqueue(a)
    worker.enqueue(b)
    assert worker.start_step(0.0) == pytest.approx(0.212)  # nothing to compute: wait for a's load
    assert (a.loaded_blocks, a.reused_tokens, a.served_by) == (2, 20, "tier_load")
    # L = 10 ms + 2 × 1 ms lookup + the copy; b's copy queues behind a's
    assert (a.lookup_s, b.lookup_s) == (pytest.approx(0.212), pytest.approx(0.412))
    assert worker.snapshot(0.0).load_backlog_s == pytest.approx(0.4)
    done = drive(worker, [])
    assert done == [a, b]
    assert a.prefill_end_s - (a.admitted_s + a.lookup_s) >= 0
    assert a.first_token_s - a.arrival_s == pytest.approx(sum(terms(a)))


def tiered_worker(capacity_blocks: int = 100, **config) -> SimWorker:
    """A unit worker with CPU / disk tiers of 40-byte blocks (10 tokens × 4 B)."""
    worker = make_worker(capacity_blocks)
    worker.tiers = WorkerTiers(TierConfig(**({"disk_bytes": 0, "remote_bytes": 0} | config)), block_bytes=40)
    return worker


def test_a_loaded_request_waiting_for_its_first_chunk_counts_that_wait_in_q_not_p():
    # a's prefix is in CPU (0.2 s copy + 12 ms lookup); b arrives during the copy and is admitted
    # first, so a's first chunk waits behind b's 900-token prefill (9 full steps)
    worker = tiered_worker(cpu_bytes=400, cpu_to_gpu=LinkSpec(400.0, 0.0))
    worker.tiers.put_cpu([1, 2])
    a, b = req(1, 0.0, 25, 2, [1, 2]), req(0, 0.01, 900, 2, range(100, 190))
    drive(worker, [a, b])
    first_chunk_s = b.prefill_end_s  # b's 9 chunks fill 9 steps; a's 5 tokens take the next one
    q, lookup, _, p, _ = terms(a)
    assert (lookup, q) == (approx(0.212), approx(first_chunk_s - 0.212))
    assert p == approx(a.prefill_end_s - first_chunk_s) and p < 0.02  # one step, not the 1.2 s behind b
    assert a.first_token_s - a.arrival_s == approx(sum(terms(a)))


def test_an_admission_loads_only_what_its_own_demotions_left_in_the_tiers():
    # CPU and disk hold 2 blocks each; r's prefix (101, 102) sits on disk
    worker = tiered_worker(
        capacity_blocks=4,
        cpu_bytes=80,
        disk_bytes=80,
        cpu_to_gpu=LinkSpec(400.0, 0.0),
        disk_to_cpu=LinkSpec(400.0, 0.0),
    )
    worker.tiers.disk.put([101, 102])
    worker.tiers.cpu.put([201, 202])
    drive(worker, [req(0, 0.0, 30, 1, [301, 302, 303])])  # 3 idle GPU blocks
    r = req(1, 10.0, 25, 5, [101, 102])  # needs 3 blocks: 2 idle GPU blocks are demoted to CPU,
    worker.enqueue(r)  # CPU's 201, 202 to disk, and disk's 101, 102 are dropped
    worker.start_step(10.0)
    assert not any(h in worker.tiers.cpu or h in worker.tiers.disk for h in (101, 102))
    assert (r.loaded_blocks, r.reused_tokens, r.served_by) == (0, 0, "recompute")


def test_an_admission_keeps_the_prefix_it_loads_when_the_tier_has_room_for_it():
    # CPU holds 3 blocks: r's prefix (101, 102, LRU head) and 201; 1 GPU block is demoted
    worker = tiered_worker(capacity_blocks=3, cpu_bytes=120, cpu_to_gpu=LinkSpec(400.0, 0.0))
    worker.tiers.cpu.put([101, 102, 201])
    drive(worker, [req(0, 0.0, 10, 1, [301])])
    r = req(1, 10.0, 25, 5, [101, 102])
    worker.enqueue(r)
    worker.start_step(10.0)
    assert set(worker.tiers.cpu.order()) == {101, 102, 301}  # 201 went, not the prefix
    assert (r.loaded_blocks, r.reused_tokens, r.served_by) == (2, 20, "tier_load")


def fetching_worker(capacity_blocks: int = 50) -> tuple[SimWorker, SimRequest]:
    """A worker idle-waiting from t = 0 for request 1's 2-block fetch over a 40 B/s link (until 2 s)."""
    worker = tiered_worker(capacity_blocks, cpu_bytes=400, network=LinkSpec(40.0, 0.0))
    a = req(1, 0.0, 25, 5, [11, 12], predicted_reuse_tokens=20)
    a.fetch_hashes = (11, 12)
    _, a.ready_s = worker.tiers.network.reserve(0.0, 80)
    worker.enqueue_fetched(a)
    worker.start_step(0.0)
    return worker, a


def test_an_idle_waiting_worker_reports_no_step_and_the_oracle_restarts_it():
    worker, _ = fetching_worker()
    assert worker.idle_wait and worker.step_end_s == 2.0
    assert worker.snapshot(0.5).step_remaining_s == 0.0
    oracle_s = worker.fork().run_until_first_token(req(2, 0.5, 25, 5, [21, 22]), 0.5)
    probe = req(2, 0.5, 25, 5, [21, 22])
    drive(worker, [probe])  # the simulator's loop restarts the idle worker on the arrival
    assert oracle_s == approx(probe.first_token_s) and probe.queued_until_s == 0.5


def test_snapshot_counts_fetching_requests_as_not_yet_admitted():
    worker, a = fetching_worker(capacity_blocks=15)
    b = req(2, 1.0, 25, 5, [21, 22])
    worker.enqueue(b)
    snap = worker.snapshot(1.0)
    # blocks to allocate: a's 3 less the 2 it was promised, b's 3
    assert (snap.waiting_prompt_blocks, snap.oldest_waiting_s) == (4, 1.0)
    assert worker.snapshot(1.0).waiting_prefill == ((5, 20), (25, 0))  # a, then b
    worker._wake(2.5)  # a's transfer has landed: it queues behind b, yet it is the oldest
    assert (worker.snapshot(2.5).oldest_waiting_s, worker.snapshot(2.5).waiting_prefill) == (2.5, ((25, 0), (5, 20)))


def test_snapshot_counts_the_idle_blocks_the_queued_prefixes_pin():
    """Request 0's prompt blocks 1–4 are idle after it ends; 1 and 2 are held again by a running
    request. Two queued requests promised 1–3 and 1–2 need their new blocks (2 and 3) plus block 3,
    once: 1 and 2 are held, so admitting them takes nothing more."""
    worker = make_worker()
    drive(worker, [req(0, 0.0, 45, 1, range(1, 6))])
    worker.enqueue(req(1, 1.0, 25, 50, [1, 2, 7], predicted_reuse_tokens=20))
    worker.finish_step(worker.start_step(1.0))  # its prefill step: it decodes, holding 1, 2 and 7
    assert sorted(worker.pool.eviction_order()) == [3, 4]  # idle; 1 and 2 are held
    worker.enqueue(req(2, 1.0, 45, 1, [1, 2, 3, 8, 9], predicted_reuse_tokens=30))
    worker.enqueue(req(3, 1.0, 45, 1, [1, 2, 10, 11, 12], predicted_reuse_tokens=20))
    assert worker.snapshot(1.0).waiting_prompt_blocks == (5 - 3) + (5 - 2) + 1


def admission_blocks_recounted(worker: SimWorker) -> int:
    """``waiting_prompt_blocks`` counted from scratch: each unadmitted request's new blocks, plus the
    idle blocks of their expected prefixes, each once."""
    idle, prefixes, new_blocks = set(worker.pool.eviction_order()), set(), 0
    for r in (*worker.fetching, *worker.waiting):
        new_blocks += blocks_to_allocate(r.sequence_tokens, r.router_reuse_tokens, BLOCK)
        prefixes.update(r.full_block_hashes[: r.router_reuse_tokens // BLOCK])
    return new_blocks + len(prefixes & idle)


def test_the_snapshots_admission_blocks_equal_a_recount_through_evictions_and_preemptions():
    """Three conversations whose turns each extend the last (the router expecting the previous
    turn's blocks back), in 24 blocks of memory with outputs long enough to preempt: at every
    event the kept count equals a recount from the queue and the pool."""
    requests = []
    for i in range(18):
        family, turn = i % 3, i // 3
        full = 2 + turn  # full prompt blocks, growing by one a turn
        hashes = [100 * family + k for k in range(full + 1)]
        requests.append(req(i, 0.05 * i, full * BLOCK + 5, 40 + 7 * (i % 4), hashes, (full - 1) * BLOCK * (turn > 0)))
    worker = make_worker(capacity_blocks=24)
    pending, checks = deque(requests), 0
    while pending or worker.step_end_s is not None:
        t_step = worker.step_end_s if worker.step_end_s is not None else math.inf
        if pending and pending[0].arrival_s < t_step:
            request = pending.popleft()
            worker.enqueue(request)
            if worker.step_end_s is None or worker.idle_wait:
                worker.start_step(request.arrival_s)
            now_s = request.arrival_s
        else:
            worker.finish_step(t_step)
            worker.start_step(t_step)
            now_s = t_step
        assert worker.snapshot(now_s).waiting_prompt_blocks == admission_blocks_recounted(worker)
        checks += 1
    assert worker.preemptions > 0 and worker.evicted_blocks > 0 and checks > 50
    assert worker.snapshot(now_s).waiting_prompt_blocks == 0 and worker.pool.watched_idle_blocks == 0


def test_recent_step_is_the_last_finished_step_not_the_running_one():
    worker = make_worker(jitter_sigma=0.5, speed_fraction=0.5, slowdown_from_s=0.0)
    worker.enqueue(req(0, 0.0, 95, 5, range(1, 10)))
    end1 = worker.start_step(0.0)
    assert worker.snapshot(0.0).recent_step_s == 0.0  # nothing has finished yet
    worker.finish_step(end1)
    end2 = worker.start_step(end1)
    assert end2 - end1 != approx(end1)
    assert worker.snapshot(end1).recent_step_s == end1
    # the running step's time left is its nominal time, not its true (jittered, halved-speed) end
    remaining_s = worker.snapshot(end1).step_remaining_s
    worker.finish_step(end2)
    assert remaining_s == approx(worker.last_step_nominal_s) and remaining_s < 0.8 * (end2 - end1)


def test_prefill_busy_time_counts_steps_while_a_request_loads_its_prefix():
    # d decodes throughout; a's prefix is copied from CPU for 0.212 s, during which only d's
    # decode steps run: a waits for its first token all along, so every step until its
    # prefill ends is busy time (and no later one)
    worker = tiered_worker(cpu_bytes=400, cpu_to_gpu=LinkSpec(400.0, 0.0))
    worker.tiers.put_cpu([1, 2])
    d, a = req(0, 0.0, 10, 200, [901]), req(1, 0.0, 25, 2, [1, 2])
    drive(worker, [d, a])
    assert a.loaded_blocks == 2 and a.prefill_end_s > a.ready_s > 0.212
    assert worker.prefill_busy_s == approx(a.prefill_end_s)


def test_kv_is_allocated_as_the_sequence_grows_not_reserved_for_the_output():
    worker = make_worker(capacity_blocks=8)
    a = req(0, 0.0, 45, 20, [1, 2, 3, 4, 5])  # 5 prompt blocks; 45 + 19 = 64 tokens of KV at most: 7 blocks
    worker.enqueue(a)
    end = worker.start_step(0.0)
    assert worker.pool.used_blocks == 5  # the prompt only (vLLM's allocate_slots), not ceil(65 / 10) = 7
    used = []
    while worker.step_end_s is not None:
        worker.finish_step(end)
        used.append(worker.pool.used_blocks)
        end = worker.start_step(end)
    # decode step k writes the KV of token 45 + k − 1: blocks 6 and 7 open at k = 6 and k = 16
    assert used == [5] * 6 + [6] * 10 + [7] * 3 + [0]
    assert worker.preemptions == 0 and a.emitted_tokens == 0


def test_a_decoder_that_finds_the_pool_full_preempts_the_latest_admitted_which_recomputes_later():
    worker = make_worker(capacity_blocks=8)
    a = req(0, 0.0, 20, 30, [1, 2, 3])  # step 1 alone: 2 prompt blocks, new blocks at its decode steps 1, 11, 21
    b = req(1, 0.0, 35, 30, [11, 12, 13, 14])  # step 2: 4 prompt blocks, new blocks at decode steps 7, 17, 27
    drive(worker, [a, b])
    # decode step 11: a needs a 9th block; b, admitted last, is preempted after 1 + 9 tokens
    assert (a.preemptions, b.preemptions, worker.preemptions) == (0, 1, 1)
    assert b.emitted_tokens == 10 and b.sequence_tokens == 45
    assert b.admitted_s == b.queued_until_s == a.prefill_end_s  # its TTFT terms are those of its first prefill
    assert b.reused_tokens == 0 and b.prefill_end_s < a.finish_s
    # b fits again only once a is done: its 3 cached prompt blocks were kept, so it recomputes 15 tokens
    # after 30 of context (15 ms + 15 × 38 µs + 1 ms, lookup 10 + 3 ms), then decodes its 19 remaining
    # tokens, a step each of 2 ms + 10 µs × context 46 … 64
    recompute_s = 0.015 + 15 * 38e-6 + 0.001 + 0.013
    assert b.finish_s == approx(a.finish_s + recompute_s + 19 * 0.002 + 1e-5 * sum(range(46, 65)))
    # b then grows to 7 blocks, the 2nd of them evicting a's idle prompt tail (a freed its blocks tail first)
    assert [e[2] for e in worker.events if e[1] == "removed"] == [[2]]
    assert worker.pool.used_blocks == 0 and worker.decode_context_tokens == 0


def test_a_request_preempted_during_its_prefill_counts_the_lost_time_in_its_queue_term():
    worker = make_worker(capacity_blocks=53)
    a = req(0, 0.0, 25, 30, [1, 2, 3])  # 3 blocks, a new one at decode steps 6, 16, 26
    b = req(1, 0.04, 500, 1, range(100, 150))  # admitted at a's decode step 2: 50 blocks, chunks until step 7
    done = drive(worker, [a, b])
    assert done == [a, b]
    assert b.preemptions == 1 and not b.first_token_out
    assert b.admitted_s == b.queued_until_s == a.finish_s  # admitted again once a freed its blocks
    q, lk, x, p, f = terms(b)
    assert q == approx(a.finish_s - 0.04)
    assert q + lk + x + p + f == approx(b.first_token_s - b.arrival_s)
    # its chunks were cached as they were scheduled (vLLM's allocate_slots), so the readmission finds
    # the 39 blocks (390 tokens) that a's growth did not evict after the preemption freed them
    assert b.reused_tokens == 390


def test_a_request_admitted_before_a_sibling_prefill_ends_reuses_the_chunks_already_scheduled():
    # a's 305 tokens take four steps (100, 100, 100, 5 tokens); b, of the same family, arrives during
    # the first and is admitted with a's last chunk, before a's prefill ends. vLLM caches each chunk's
    # full blocks as the step is scheduled (allocate_slots → cache_blocks), so b finds all 30 of a's
    # full blocks; caching only at the end of a's prefill would have given it none.
    worker = make_worker()
    a = req(0, 0.0, 305, 1, range(1, 32))
    b = req(1, 0.05, 320, 1, [*range(1, 31), 40, 41])
    drive(worker, [a, b])
    assert b.admitted_s < a.prefill_end_s
    assert b.reused_tokens == 300
    stored = [(hashes[0], len(hashes)) for _, kind, hashes, _, _ in worker.events if kind == "stored"]
    assert stored == [(1, 10), (11, 10), (21, 10), (40, 2)]  # one event per scheduled chunk


def test_snapshot_reports_each_decoders_output_so_far():
    worker = make_worker()
    worker.enqueue(req(0, 0.0, 45, 5, range(1, 6)))
    end = worker.start_step(0.0)
    worker.finish_step(end)  # the prefill step made the first token
    assert worker.snapshot(end).running_output_tokens == (1,)
    worker.enqueue(req(1, end, 45, 5, range(10, 15)))
    for _ in range(2):  # the second request's prefill step is the first one's second decode step
        end = worker.start_step(end)
        worker.finish_step(end)
    assert sorted(worker.snapshot(end).running_output_tokens) == [2, 3]


def test_snapshot_counts_queued_work_net_of_the_expected_reuse_where_the_router_gave_one():
    """Promised 20 tokens (2 blocks of 10), expected to keep 10: the queue and the blocks count 35 and 4."""
    worker = make_worker()
    r = SimRequest(0, 0.0, 45, 1, (1, 2, 3, 4, 5), 20, expected_reuse_tokens=10)
    worker.enqueue(r)
    snap = worker.snapshot(0.0)
    assert snap.waiting_prefill == ((35, 10),) and snap.waiting_prompt_blocks == 4
    assert worker.queued_prefill_tokens == 35 and r.predicted_reuse_tokens == 20  # the promise stays for the log
