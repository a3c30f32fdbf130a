"""``POST /v1/evict/rank`` bodies of many nodes, for the pool's tests and benchmarks."""

import json

import numpy as np


def forest_body(n: int, chain_blocks: int = 24, policy: str = "cost_aware", seed: int = 0) -> bytes:
    """``n`` nodes in chains of ``chain_blocks`` (the eviction study's shape), as a JSON body;
    ``chain_blocks = n`` is one chain ``n`` deep."""
    rng = np.random.default_rng(seed)
    last = np.repeat(rng.uniform(0, 3600, n // chain_blocks + 1), chain_blocks)[:n].round(3)
    nodes = []
    for i in range(n):
        depth = i % chain_blocks
        nodes.append(
            {
                "node_id": i,
                "parent_id": i - 1 if depth else None,
                "depth_blocks": depth,
                "hits": int(rng.integers(0, 5)),
                "last_access_s": float(last[i]),
                "created_s": float(last[i]) / 2,
                "size_bytes": 2.0**26,
                "prefill_saved_s": 0.026 + 0.00088 * depth,
            }
        )
    return json.dumps({"policy": policy, "now_s": 3600.0, "nodes": nodes}).encode()
