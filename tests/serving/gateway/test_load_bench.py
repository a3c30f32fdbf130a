"""Benchmark of the gateway's load accounting (``make bench``; not run by default): printed, not asserted.

What one route costs the gateway before the router runs: :meth:`SentLoad.snapshot` of every
candidate, with 32 engines each running 400 decoders (their streamed tokens known) and 4
requests waiting, 1,000 routes.
"""

import time

import numpy as np
import pytest

from kvcost.serving.gateway.load import SentLoad

pytestmark = pytest.mark.bench

N_WORKERS, DECODERS, WAITING = 32, 400, 4


def test_bench_sent_load_snapshots_of_32_busy_workers():
    rng = np.random.default_rng(0)
    load = SentLoad()
    request_id = 0
    for worker in range(N_WORKERS):
        for k in range(DECODERS + WAITING):
            load.routed(request_id, worker, input_tokens=int(rng.integers(500, 4000)), reusable_tokens=0)
            if k < DECODERS:
                load.first_token(request_id)
                load.generated(request_id, int(rng.integers(1, 400)))
            request_id += 1
    times = np.empty(1000)
    for k in range(len(times)):
        t0 = time.perf_counter()
        for worker in range(N_WORKERS):
            load.snapshot(worker, "a100", None, block_size_tokens=16)
        times[k] = time.perf_counter() - t0
    p50, p99 = np.quantile(times, [0.5, 0.99]) * 1e3
    print(f"\nbench: SentLoad.snapshot of {N_WORKERS} workers × {DECODERS} decoders + {WAITING} waiting, per route:")
    print(f"  P50 {p50:.3f} ms, P99 {p99:.3f} ms")
