"""KV-cache eviction policies registered by name (docs/architecture.md §5): ``lru``, ``lfu``, ``gdsf``, ``lhd``,
``flop_aware``, ``cost_aware``, and the offline reference ``clairvoyant``; the vectorised ranking and the
incremental index a block pool uses."""

from kvcost.eviction import clairvoyant, cost_aware, flop_aware, gdsf, lhd, recency  # noqa: F401  (registration)
from kvcost.eviction.base import (
    EVICTION_POLICIES,
    VALUE_TERMS,
    EvictionContext,
    EvictionPolicy,
    NodeTable,
    Ranking,
    deployable_policies,
    make_eviction_policy,
    rank_nodes,
)
from kvcost.eviction.clairvoyant import NextUseTable
from kvcost.eviction.index import EvictionIndex
from kvcost.eviction.prefill import BlockCostTable, block_cost_table

__all__ = [
    "EVICTION_POLICIES",
    "VALUE_TERMS",
    "BlockCostTable",
    "EvictionContext",
    "EvictionIndex",
    "NextUseTable",
    "EvictionPolicy",
    "NodeTable",
    "Ranking",
    "block_cost_table",
    "deployable_policies",
    "make_eviction_policy",
    "rank_nodes",
]
