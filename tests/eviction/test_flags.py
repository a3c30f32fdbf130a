"""The eviction policies' class flags: which one a block pool runs natively, which one needs a reuse model."""

import numpy as np
import pytest

from kvcost.eviction import EVICTION_POLICIES, BlockCostTable, EvictionContext
from kvcost.eviction.index import make_eviction_index, needs_index
from kvcost.eviction.recency import LFUPolicy
from kvcost.replay.config import ClusterConfig
from kvcost.replay.simulator import ClusterSimulator

COSTS = BlockCostTable(np.array([0.1, 0.2]), np.array([1.0, 2.0]), size_bytes=1.0)


def test_lru_is_the_pool_native_policy_cost_aware_the_one_with_a_reuse_model_clairvoyant_the_offline_one():
    assert [n for n in EVICTION_POLICIES if EVICTION_POLICIES.get(n).pool_native] == ["lru"]
    assert [n for n in EVICTION_POLICIES if EVICTION_POLICIES.get(n).uses_reuse_model] == ["cost_aware"]
    assert [n for n in EVICTION_POLICIES if EVICTION_POLICIES.get(n).reads_future] == ["clairvoyant"]
    needing = ["clairvoyant", "cost_aware", "flop_aware", "gdsf", "lfu", "lhd"]
    assert [n for n in EVICTION_POLICIES if needs_index(n)] == needing
    assert make_eviction_index("lru", EvictionContext(), COSTS, 8) is None
    assert make_eviction_index("lfu", EvictionContext(), COSTS, 8).policy.name == "lfu"
    with pytest.raises(KeyError, match="unknown eviction policy 'mru'"):
        needs_index("mru")


def _pool_policies(eviction_policy: str) -> list[str]:
    sim = ClusterSimulator(ClusterConfig(eviction_policy=eviction_policy), block_size_tokens=16)
    return [w.pool.eviction_policy for w in sim.workers]


def test_the_simulator_builds_an_index_by_the_flag_not_the_name(monkeypatch):
    assert _pool_policies("lfu") == ["lfu"] * 4
    monkeypatch.setattr(LFUPolicy, "pool_native", True)
    assert _pool_policies("lfu") == ["lru"] * 4  # without an index the pool runs its native (vLLM LRU) order
