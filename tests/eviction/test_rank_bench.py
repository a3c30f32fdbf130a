"""Benchmark: ranking 100,000 idle nodes (prints timings; no assertion on speed)."""

import time

import numpy as np
import pytest

from kvcost.eviction import EvictionContext, NodeTable, make_eviction_policy, rank_nodes
from kvcost.models.reuse_cure import CureReuseModel

#: The cure model the eviction study fits at 10 % cache on the conversation trace (rounded).
CURE = CureReuseModel(
    474.0, [(0.218, 5.209, 1.060), (0.133, 5.349, 0.975), (0.314, 5.714, 1.166), (0.586, 5.517, 1.607)]
)


def forest(n: int, chain_blocks: int, seed: int) -> NodeTable:
    """``n`` nodes in chains of ``chain_blocks`` (each node's parent is the previous one in its chain)."""
    rng = np.random.default_rng(seed)
    depth = np.arange(n) % chain_blocks
    parent = np.where(depth > 0, np.arange(n) - 1, -1)
    last = np.repeat(rng.uniform(0, 3600, n // chain_blocks + 1), chain_blocks)[:n]
    return NodeTable(
        depth_blocks=depth,
        hits=rng.integers(0, 5, n),
        last_access_s=last,
        created_s=last - rng.uniform(0, 600, n),
        size_bytes=np.full(n, 2.0**26),
        prefill_saved_s=0.026 + 0.00088 * depth,
        restore_s=np.full(n, np.inf),
        flops_saved=np.full(n, 1e13),
        category=np.zeros(n, dtype=np.int64),
        request_blocks=np.full(n, chain_blocks),
        parent=parent,
        request_reused_blocks=rng.integers(0, chain_blocks + 1, n),
    )


@pytest.mark.bench
@pytest.mark.parametrize("policy", ["lru", "lfu", "gdsf", "lhd", "flop_aware", "cost_aware", "cost_aware+cure"])
def test_bench_rank_100k_nodes(policy):
    nodes = forest(100_000, chain_blocks=24, seed=0)
    name, _, model = policy.partition("+")
    p = make_eviction_policy(name, EvictionContext(horizon_s=474.0, reuse_model=CURE if model else None))
    rank_nodes(p, nodes, 3600.0)  # warm-up
    times = []
    for _ in range(5):
        started = time.perf_counter()
        rank_nodes(p, nodes, 3600.0)
        times.append(time.perf_counter() - started)
    print(f"\nrank 100,000 nodes ({policy}): median {np.median(times) * 1e3:.1f} ms, min {min(times) * 1e3:.1f} ms")
