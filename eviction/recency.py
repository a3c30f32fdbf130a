"""``lru`` and ``lfu``: the recency and frequency baselines."""

from __future__ import annotations

import numpy as np

from kvcost.eviction.base import EVICTION_POLICIES, EvictionPolicy, NodeTable, base_terms


@EVICTION_POLICIES.register("lru")
class LRUPolicy(EvictionPolicy):
    """vLLM's default: the least recently freed idle block first, any idle block (no leaf rule).

    value = ``last_access_s``. Source: vLLM ``vllm/v1/core/block_pool.py``
    (``FreeKVCacheBlockQueue``: freed blocks are appended, eviction pops the
    head; a request's blocks are freed tail first, ``kv_cache_manager.free``).
    The simulated :class:`~kvcost.replay.kv_cache.BlockPool` keeps its exact
    ordered-dict implementation for this policy.
    """

    name = "lru"
    leaves_only = False
    pool_native = True

    def terms(self, nodes: NodeTable, now_s: float) -> dict[str, np.ndarray]:
        return base_terms(nodes, nodes.last_access_s.astype(np.float64))


@EVICTION_POLICIES.register("lfu")
class LFUPolicy(EvictionPolicy):
    """Least frequently used idle leaf first: value = ``hits`` (ties: older ``last_access_s`` first).

    Classic LFU (no ageing); frequency is the hits since the block was stored.
    """

    name = "lfu"

    def terms(self, nodes: NodeTable, now_s: float) -> dict[str, np.ndarray]:
        return base_terms(nodes, nodes.hits.astype(np.float64))
