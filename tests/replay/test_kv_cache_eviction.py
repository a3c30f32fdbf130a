"""BlockPool with pluggable eviction: exact orders per policy, active blocks never evicted, leaf rule, history."""

import numpy as np
import pytest

from kvcost.eviction import BlockCostTable, EvictionContext
from kvcost.eviction.index import make_eviction_index
from kvcost.replay.kv_cache import BlockPool

# a hit at depth d saves (d + 1) × 0.1 s; one block is 1 byte; FLOPs as seconds
COSTS = BlockCostTable(
    prefill_saved_s=np.array([0.1, 0.2, 0.3, 0.4]), flops_saved=np.array([1.0, 2.0, 3.0, 4.0]), size_bytes=1.0
)


def pool(policy: str, capacity: int = 8, **context) -> BlockPool:
    index = make_eviction_index(policy, EvictionContext(**context), COSTS, capacity)
    return BlockPool(capacity, eviction=index, record_events=True)


def serve(p: BlockPool, hashes: list[int], t_s: float, done_s: float | None = None):
    """Admit at ``t_s``, register, and free at ``done_s`` (None: keep it running)."""
    allocation, evicted = p.try_allocate(hashes, len(hashes), t_s)
    assert allocation is not None
    p.register_prefill(allocation, hashes, t_s)
    if done_s is not None:
        p.free(allocation, done_s)
    return allocation, evicted


def history(p: BlockPool, now_s: float | None = None) -> list[int]:
    """Access sequence: chain A = 1←2←3 served twice, chain B = 4 once, chain C = 5←6 once."""
    serve(p, [1, 2, 3], 0.0, 1.0)
    serve(p, [4], 2.0, 3.0)
    serve(p, [1, 2, 3], 4.0, 5.0)  # A's three blocks hit
    serve(p, [5, 6], 6.0, 7.0)
    return p.eviction_order(now_s)


def test_lru_keeps_vllms_order_and_ignores_the_tree():
    p = BlockPool(8, record_events=True)
    assert history(p) == [4, 3, 2, 1, 6, 5]
    assert p.eviction_policy == "lru"


@pytest.mark.parametrize(
    ("policy", "order"),
    [
        ("lfu", [4, 6, 5, 3, 2, 1]),  # hits 0 first (older first), A's blocks (1 hit each) last, tails first
        ("gdsf", [4, 6, 5, 3, 2, 1]),  # H = (hits+1) × saved / 1: 4 → 0.1, 6 → 0.2 (5 after its child), A ≥ 0.6
    ],
)
def test_each_policy_eviction_order_on_a_hand_made_sequence(policy, order):
    assert history(pool(policy)) == order


def test_flop_aware_order_at_now():
    # at 7 s, normalised over every idle block: recency 4 → 0, A → 0.5, C → 1; FLOPs/byte by depth 0, 0.5, 1.
    # utilities 4: 0, 1: 0.5, 2: 1, 3: 1.5, 5: 1, 6: 1.5 → subtree max 1.5 for A and C; A is older
    assert history(pool("flop_aware"), now_s=7.0) == [4, 3, 2, 1, 6, 5]


def test_cost_aware_order_follows_p_reuse_times_seconds_saved():
    # prior p = exp(−idle / 10 s); at 7 s: 4 (idle 4 s, depth 0) 0.1·e^-0.4 = 0.067; A's leaf 3 (idle 2 s,
    # depth 2) 0.3·e^-0.2 = 0.246; C's leaf 6 (idle 0 s, depth 1) 0.2 → 4, C (6, 5), A (3, 2, 1)
    p = pool("cost_aware", horizon_s=10.0)
    assert history(p, now_s=7.0) == [4, 6, 5, 3, 2, 1]
    slots = np.array([p._index._slot[h] for h in (4, 3, 6)])
    assert p._index.policy.terms(p._index.table(slots), 7.0)["value"].round(3).tolist() == [0.067, 0.246, 0.2]


def test_a_parent_exposed_between_reranks_carries_its_reranked_value():
    # prior p = exp(−idle / 10 s); the first eviction at 30 s re-ranks: A's leaf 3 (idle 29 s)
    # 0.3·e^-2.9 = 0.017 goes first, then its parent 2 at 0.2·e^-2.9 = 0.011 < B's leaf 6 at
    # 0.3·e^-0.9 = 0.122. With 2's value from when it turned idle (0.2) B's tail would go instead.
    p = pool("cost_aware", horizon_s=10.0, rerank_interval_s=100.0)
    serve(p, [1, 2, 3], 0.0, 1.0)
    serve(p, [4, 5, 6], 20.0, 21.0)
    _, evicted = serve(p, [7, 8, 9, 10], 30.0)  # 8 slots, 6 idle + 2 free: evict 2
    assert evicted == [3, 2]


def test_evictions_follow_the_order_and_lhd_runs():
    p = pool("gdsf")
    history(p)
    _, evicted = serve(p, [7, 8, 9], 8.0)  # 8 slots: 6 idle + 2 free; 3 needed → evict the first, 4
    assert evicted == [4]
    assert pool("lhd").eviction_policy == "lhd"


@pytest.mark.parametrize("policy", ["lru", "lfu", "gdsf", "lhd", "flop_aware", "cost_aware"])
def test_active_blocks_are_never_evicted_under_pressure(policy):
    p = BlockPool(6) if policy == "lru" else pool(policy, capacity=6)
    running, _ = serve(p, [1, 2, 3], 0.0)  # never freed
    serve(p, [4, 5], 1.0, 2.0)
    allocation, evicted = p.try_allocate([6, 7, 8], 3, 3.0)  # needs 3: 1 free + both idle blocks
    assert allocation is not None and sorted(evicted) == [4, 5]
    assert p.match_blocks([1, 2, 3]) == 3
    assert p.try_allocate([9], 1, 4.0) == (None, [])  # only active blocks left: refused, nothing evicted
    assert p.match_blocks([1, 2, 3]) == 3


def test_leaf_rule_never_orphans_a_cached_child():
    p = pool("lfu", capacity=5)
    serve(p, [1, 2, 3], 0.0, 1.0)
    serve(p, [1, 2, 3], 2.0, 3.0)
    p._index.value[p._index._slot[1]] = -1.0  # make the root the cheapest block: still not a candidate
    _, evicted = serve(p, [7, 8, 9, 10], 6.0)  # needs 4, 2 free → evict 2, leaves first: 3 then 2
    assert evicted == [3, 2]
    assert p.match_blocks([1]) == 1


def test_history_records_stored_hit_idle_evicted():
    p = pool("gdsf", capacity=3)
    serve(p, [1, 2], 0.0, 1.0)
    serve(p, [1], 2.0, 3.0)
    serve(p, [5, 6], 4.0, 5.0)
    assert p.block_events == [
        (0.0, 1, "stored", 0, 2, 0),
        (0.0, 2, "stored", 1, 2, 0),
        (1.0, 2, "idle", 1, 2, 0),
        (1.0, 1, "idle", 0, 2, 0),
        (2.0, 1, "hit", 0, 1, 1),  # the request of one block found it cached
        (3.0, 1, "idle", 0, 1, 1),
        (4.0, 2, "evicted", 1, 0, 0),
        (4.0, 5, "stored", 0, 2, 0),
        (4.0, 6, "stored", 1, 2, 0),
        (5.0, 6, "idle", 1, 2, 0),
        (5.0, 5, "idle", 0, 2, 0),
    ]
