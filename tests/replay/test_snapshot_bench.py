"""Benchmark: a simulated worker's snapshot against its queue's depth (``make bench``).

The router reads every worker's snapshot at every arrival. In a deep overload each worker queues
hundreds of requests, and the snapshot's queue-wide figures (the waiting pairs, the blocks
admission takes) were recounted at every read: on `gen:mix` at 4 workers and rate 2 that was a
third of the replay's time under a profiler. They are now kept as the queue changes
(``SimWorker._queue_changed``, ``BlockPool.watch``). The bench prints the time of a snapshot at two
queue depths, with the queue unchanged between reads and with one request joining before each.
"""

import time

import pytest

from kvcost.core.types import blocks_to_allocate
from tests.replay.test_worker import BLOCK, admission_blocks_recounted, drive, make_worker, req

READS = 2_000


def queued_worker(depth: int):
    """A worker whose cache holds 50 finished conversations (idle), with ``depth`` requests queued
    behind a head that does not fit, each extending one of those conversations by a block."""
    worker = make_worker(capacity_blocks=2_000)
    drive(worker, [req(i, 0.0, 20 * BLOCK, 1, [1_000 * i + k for k in range(21)]) for i in range(50)])
    worker.enqueue(req(-1, 1.0, 5_000 * BLOCK, 1, range(10**6, 10**6 + 5_001)))  # the head: never fits
    for i in range(depth):
        family = i % 50
        hashes = [1_000 * family + k for k in range(22)]
        worker.enqueue(req(i + 100, 1.0, 21 * BLOCK, 1, hashes, predicted_reuse_tokens=20 * BLOCK))
    worker.start_step(1.0)
    return worker


def reads_per_s(worker, joining: bool) -> float:
    start = time.perf_counter()
    for i in range(READS):
        if joining:
            worker.enqueue(req(10**7 + i, 1.0, 21 * BLOCK, 1, [1_000 * (i % 50) + k for k in range(22)], 20 * BLOCK))
        worker.snapshot(1.0)
    return READS / (time.perf_counter() - start)


@pytest.mark.bench
def test_snapshot_time_against_queue_depth():
    rates = {}
    for depth in (100, 1_000):
        for joining in (False, True):
            worker = queued_worker(depth)
            rates[depth, joining] = reads_per_s(worker, joining)
            expected = admission_blocks_recounted(worker)
            assert worker.snapshot(1.0).waiting_prompt_blocks == expected
            assert expected > blocks_to_allocate(5_000 * BLOCK, 0, BLOCK)  # the queued prefixes are counted
    for joining in (False, True):
        shallow, deep = rates[100, joining], rates[1_000, joining]
        print(
            f"\nsnapshot, queue {'changing' if joining else 'unchanged'} between reads: "
            f"{1e6 / shallow:.1f} µs at 100 queued, {1e6 / deep:.1f} µs at 1,000 (× {shallow / deep:.2f})"
        )
