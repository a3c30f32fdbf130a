"""Benchmarks of the scoring path (``make bench``; not run by default): printed, not asserted.

* in-process ``Router.route``: 16 candidates, 8,192-token requests, 10,000 decisions;
* in-process ``ScoringService.route`` (what ``POST /v1/route`` runs after parsing the body): 32
  candidates with inline snapshots, block hashes given, 5,000 decisions;
* vLLM-compatible token hashing of one 8,192-token prompt, per ``--prefix-caching-hash-algo``;
* ``POST /v1/route`` on a real uvicorn process at 200 requests/s from a loopback
  load generator (httpx clients in threads, open loop: each request is sent at
  its scheduled time), then ``POST /v1/observe`` of the same ids at 200/s (the
  cost of durable observations). Duration ``KVCOST_BENCH_S`` seconds per phase
  (default 60, the issue's figure).
"""

import json
import os
import threading
import time

import httpx
import numpy as np
import pytest

from kvcost.core.hardware import StepTimeModel
from kvcost.core.types import Namespace, RouteRequest, WorkerSnapshot
from kvcost.routing.block_hash import HASH_ALGORITHMS, BlockHasher, PrefixHashCache, block_hashes_for
from kvcost.routing.directory import CacheDirectory
from kvcost.routing.router import Router, RouterSettings
from kvcost.serving.schemas import ScoreRequestIn
from kvcost.serving.service import ScoringService
from kvcost.serving.settings import ServiceSettings
from tests.serving.test_api_process import AUTH, Server

pytestmark = pytest.mark.bench

N_CANDIDATES = 16
INPUT_TOKENS = 8192
BLOCK = 512
RATE_PER_S = 200
DURATION_S = float(os.environ.get("KVCOST_BENCH_S", "60"))
N_THREADS = 16


def _percentiles_ms(seconds) -> str:
    p50, p90, p99, top = np.quantile(np.asarray(seconds), [0.5, 0.9, 0.99, 1.0]) * 1e3
    return f"P50 {p50:.3f} ms, P90 {p90:.3f} ms, P99 {p99:.3f} ms, max {top:.3f} ms"


def _snapshot_fields(rng, worker_id):
    waiting = [[int(rng.integers(100, 8000)), int(rng.integers(0, 4000))] for _ in range(rng.integers(0, 6))]
    return {
        "gpu": "a100" if worker_id % 2 else "h100",
        "waiting_prefill": waiting,
        "running_requests": int(rng.integers(0, 64)),
        "decode_context_tokens": int(rng.integers(0, 200_000)),
        "kv_usage": float(rng.uniform(0, 0.9)),
        "idle_cached_blocks": int(rng.integers(0, 500)),
        "recent_step_s": float(rng.uniform(0.01, 0.05)),
        "step_remaining_s": float(rng.uniform(0, 0.02)),
        "kv_capacity_blocks": 880,
    }


def _memory_bound(rng, worker_id: int, f: dict) -> WorkerSnapshot:
    """A worker whose KV memory is full (99 % held by 64–400 decoders, 200 blocks of prompts waiting)
    and whose decoders' progress is known: every candidate needs the KV-wait estimate of
    :func:`~kvcost.features.finish_times.finish_steps_batch`."""
    running = int(rng.integers(64, 400))
    progress = tuple(int(t) for t in rng.integers(1, 400, running))
    waiting = tuple(map(tuple, f["waiting_prefill"]))
    return WorkerSnapshot(
        worker_id, f["gpu"], waiting, running, running * 3000, 0.99, 0, 0.03, 0.01, 880, 200,
        running_output_tokens=progress,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("n_candidates", "memory_bound"),
    [(N_CANDIDATES, False), (32, False), (32, True)],  # 32: issues 13 and 16 ask P99 < 1 ms there
)
def test_bench_router_route_in_process(n_candidates, memory_bound):
    rng = np.random.default_rng(0)
    ns = Namespace("llama-3-8b", block_size_tokens=BLOCK)
    directory = CacheDirectory()
    prompts = [rng.integers(0, 128_000, INPUT_TOKENS).tolist() for _ in range(64)]
    hashes = [block_hashes_for(p, BLOCK, ns) for p in prompts]
    for i, h in enumerate(hashes):  # every prompt's prefix on two workers, to various depths
        for worker in (i % n_candidates, (i * 7) % n_candidates):
            directory.apply_stored(ns, worker, h[: 1 + i % len(h)], None, "gpu", 0.0)
    step_models = {gpu: StepTimeModel.for_hardware("llama-3-8b", gpu) for gpu in ("a100", "h100")}
    router = Router(directory, step_models, RouterSettings(policy="learned_cost_aware"))
    snapshots = []
    for w in range(n_candidates):
        f = _snapshot_fields(rng, w)
        snapshots.append(
            _memory_bound(rng, w, f)
            if memory_bound
            else WorkerSnapshot(
                w,
                f["gpu"],
                tuple(map(tuple, f["waiting_prefill"])),
                f["running_requests"],
                f["decode_context_tokens"],
                f["kv_usage"],
                f["idle_cached_blocks"],
                f["recent_step_s"],
                f["step_remaining_s"],
                f["kv_capacity_blocks"],
            )
        )
    times = np.empty(10_000)
    for k in range(len(times)):
        request = RouteRequest(k, 1.0, INPUT_TOKENS, hashes[k % len(hashes)], ns)
        t0 = time.perf_counter()
        router.route(request, snapshots, now_s=1.0)
        times[k] = time.perf_counter() - t0
    bound = ", every candidate short of KV memory, decoders' progress known" if memory_bound else ""
    print(f"\nbench: Router.route, {n_candidates} candidates{bound}, {INPUT_TOKENS}-token requests, 10,000 decisions: ")
    print(f"  {_percentiles_ms(times)}")


def test_bench_service_route_in_process_32_candidates(tmp_path):
    n_candidates, decisions = 32, 5_000
    rng = np.random.default_rng(0)
    ns = Namespace("llama-3-8b", block_size_tokens=BLOCK)
    hashes = [block_hashes_for(rng.integers(0, 128_000, INPUT_TOKENS).tolist(), BLOCK, ns) for _ in range(64)]
    settings = ServiceSettings(db_path=tmp_path / "log.duckdb", segment_roll_interval_s=0)
    service = ScoringService(settings, clock=lambda: 1.0, model_loader=None)
    service.start()
    try:
        for i, h in enumerate(hashes):  # every prompt's prefix on two workers, to various depths
            for worker in (i % n_candidates, (i * 7) % n_candidates):
                service.directory.apply_stored(ns, worker, h[: 1 + i % len(h)], None, "gpu", 0.0)
        candidates = [{"worker_id": w, "snapshot": _snapshot_fields(rng, w)} for w in range(n_candidates)]
        namespace = {"model": ns.model, "block_size_tokens": BLOCK}
        bodies = [
            ScoreRequestIn.model_validate(
                {
                    "request": {"request_id": k, "namespace": namespace, "block_hashes": list(hashes[k % 64])}
                    | {"input_tokens": INPUT_TOKENS},
                    "candidates": candidates,
                }
            )
            for k in range(decisions)
        ]
        times = np.empty(decisions)
        for k, body in enumerate(bodies):
            t0 = time.perf_counter()
            service.route(body)
            times[k] = time.perf_counter() - t0
    finally:
        service.stop()
    print(f"\nbench: ScoringService.route, {n_candidates} candidates, {INPUT_TOKENS}-token requests, {decisions:,}:")
    print(f"  {_percentiles_ms(times)}")


def test_bench_token_hashing_per_algorithm():
    rng = np.random.default_rng(2)
    prompt = rng.integers(0, 128_000, INPUT_TOKENS).tolist()
    print(f"\nbench: vLLM block hashes of one {INPUT_TOKENS}-token prompt, ms (P50 of 200)")
    for algorithm in HASH_ALGORITHMS:
        for block in (16, BLOCK):
            uncached = BlockHasher(block, "0", algorithm)
            cached = BlockHasher(block, "0", algorithm, PrefixHashCache(1 << 16))
            times = {}
            for name, hasher in (("uncached", uncached), ("prefix cached", cached)):
                hasher.hashes(prompt)
                samples = []
                for _ in range(200):
                    t0 = time.perf_counter()
                    hasher.hashes(prompt)
                    samples.append(time.perf_counter() - t0)
                times[name] = np.median(samples) * 1e3
            print(f"  {algorithm:12s} {block:4d}-token blocks: " + ", ".join(f"{k} {v:.3f}" for k, v in times.items()))


def _open_loop(url: str, requests: list[tuple[str, bytes]], rate_per_s: float):
    """Send ``requests`` at ``rate_per_s`` on schedule; returns per request (latency s, status, lateness s)."""
    results: list = [None] * len(requests)
    start = time.perf_counter() + 0.5
    headers = {"content-type": "application/json", **AUTH}

    def worker(k: int) -> None:
        with httpx.Client(base_url=url, headers=headers, timeout=10.0) as client:
            for i in range(k, len(requests), N_THREADS):
                scheduled = start + i / rate_per_s
                delay = scheduled - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                t0 = time.perf_counter()
                try:
                    status = client.post(requests[i][0], content=requests[i][1]).status_code
                except httpx.HTTPError:
                    status = -1
                results[i] = (time.perf_counter() - t0, status, t0 - scheduled)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(N_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (Linux ``/proc``)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _report(name: str, results) -> None:
    latency = [r[0] for r in results]
    errors = sum(1 for r in results if r[1] != 200)
    late = np.quantile([r[2] for r in results], 0.99) * 1e3
    print(f"bench: {name}: {len(results)} requests at {RATE_PER_S}/s over {DURATION_S:g} s, {errors} errors")
    print(f"  {_percentiles_ms(latency)} (client-side, loopback); send lateness P99 {late:.2f} ms")


def _route_bodies(rng, n: int, form: str) -> list[tuple[str, bytes]]:
    ns = Namespace("llama-3-8b", block_size_tokens=BLOCK)
    prompts = [rng.integers(0, 128_000, INPUT_TOKENS).tolist() for _ in range(64)]
    bodies = []
    for i in range(n):
        prompt = prompts[i % len(prompts)]
        request = {"request_id": i, "namespace": {"model": ns.model, "block_size_tokens": BLOCK}}
        if form == "token_ids":
            request["token_ids"] = prompt
        else:
            request |= {"block_hashes": list(block_hashes_for(prompt, BLOCK, ns)), "input_tokens": INPUT_TOKENS}
        candidates = [{"worker_id": w, "snapshot": _snapshot_fields(rng, w)} for w in range(N_CANDIDATES)]
        bodies.append(("/v1/route", json.dumps({"request": request, "candidates": candidates}).encode()))
    return bodies


@pytest.mark.parametrize("form", ["block_hashes", "token_ids"])
def test_bench_http_route_and_observe_at_200_per_s(tmp_path, form):
    rng = np.random.default_rng(1)
    server = Server(tmp_path, tmp_path / "log.duckdb")
    try:
        n = int(RATE_PER_S * DURATION_S)
        routes = _route_bodies(rng, n, form)
        print(f"\nbench: one route body: {len(routes[0][1]) / 1024:.0f} KiB ({form}, {N_CANDIDATES} snapshots)")
        cpu0, client0 = _cpu_s(server.proc.pid), time.process_time()
        _report(f"POST /v1/route ({form})", _open_loop(server.url, routes, RATE_PER_S))
        server_ms = (_cpu_s(server.proc.pid) - cpu0) / n * 1e3
        client_ms = (time.process_time() - client0) / n * 1e3
        print(f"  CPU per request: server {server_ms:.2f} ms, load generator {client_ms:.2f} ms (2 cores shared)")
        observes = [
            ("/v1/observe", json.dumps({"request_id": i, "ttft_s": 0.1, "queue_s": 0.01, "prefill_s": 0.08}).encode())
            for i in range(n)
        ]
        _report("POST /v1/observe (durable: answered after the DuckDB commit)", _open_loop(server.url, observes, 200))
    finally:
        server.stop()
