"""Tests for kvcost.replay.kv_cache.BlockPool (prefix match, refcounts, LRU of idle blocks only)."""

import pytest

from kvcost.replay.kv_cache import Allocation, BlockPool


def admit_and_register(pool: BlockPool, hashes: list[int], total_blocks: int) -> Allocation:
    """Allocate, then register the prompt's full blocks as after prefill (a whole request life minus free)."""
    allocation, evicted = pool.try_allocate(hashes, total_blocks)
    assert allocation is not None
    pool.register_prefill(allocation, hashes)
    return allocation


def state(pool: BlockPool) -> tuple:
    return pool.used_blocks, pool.idle_blocks, pool.free_blocks, pool.eviction_order()


def test_capacity_must_be_positive():
    with pytest.raises(ValueError) as err:
        BlockPool(0)
    assert str(err.value) == "capacity_blocks = 0, expected an integer ≥ 1"


def test_allocate_register_free_accounting():
    pool = BlockPool(10)
    allocation, evicted = pool.try_allocate([1, 2, 3], 5)  # 3 full prompt blocks + 2 more
    assert evicted == []
    assert (allocation.reused_blocks, allocation.private_blocks, allocation.cached_hashes) == (0, 5, [])
    assert state(pool) == (5, 0, 5, [])
    assert pool.usage() == 0.5
    assert pool.match_blocks([1, 2, 3]) == 0  # not cached before prefill
    assert pool.register_prefill(allocation, [1, 2, 3]) == [1, 2, 3]
    assert (allocation.private_blocks, allocation.cached_hashes) == (2, [1, 2, 3])
    assert state(pool) == (5, 0, 5, [])
    assert pool.match_blocks([1, 2, 3, 4]) == 3
    assert pool.match_blocks([2, 3]) == 2  # the caller's chain decides; a cached hash matches
    assert pool.match_blocks([9, 1]) == 0  # stops at the first miss
    pool.free(allocation)
    assert (allocation.private_blocks, allocation.cached_hashes) == (0, [])
    assert state(pool) == (0, 3, 7, [3, 2, 1])
    assert pool.usage() == 0.0
    assert pool.match_blocks([1, 2, 3]) == 3  # idle blocks still match


def test_free_is_tail_first_so_the_tail_is_evicted_before_the_head():
    pool = BlockPool(5)
    pool.free(admit_and_register(pool, [1, 2, 3, 4], 5))
    assert pool.eviction_order() == [4, 3, 2, 1]
    allocation, evicted = pool.try_allocate([9], 2)  # 1 free block, 1 more must be evicted
    assert allocation is not None and evicted == [4]
    assert pool.match_blocks([1, 2, 3, 4]) == 3  # the head of the prefix survives
    assert state(pool) == (2, 3, 0, [3, 2, 1])


def test_exact_eviction_order_and_active_blocks_are_never_evicted():
    pool = BlockPool(8)
    r1 = admit_and_register(pool, [10], 1)  # keeps running: block 10 is the least recently used
    pool.free(admit_and_register(pool, [1, 2, 3], 3))
    pool.free(admit_and_register(pool, [4, 5], 2))
    assert pool.eviction_order() == [3, 2, 1, 5, 4]
    assert state(pool) == (1, 5, 2, [3, 2, 1, 5, 4])

    # reusing idle block 1 takes it out of the LRU; 3 blocks needed, 2 free → evict exactly one (3)
    r4, evicted = pool.try_allocate([1, 6], 4)
    assert evicted == [3]
    assert (r4.reused_blocks, r4.private_blocks, r4.cached_hashes) == (1, 3, [1])
    assert pool.eviction_order() == [2, 5, 4]
    assert state(pool) == (5, 3, 0, [2, 5, 4])

    # 3 needed: every idle block goes, but neither the running request's 10 nor r4's 1
    r5, evicted = pool.try_allocate([7], 3)
    assert evicted == [2, 5, 4]
    assert r5.reused_blocks == 0
    assert state(pool) == (8, 0, 0, [])
    assert pool.match_blocks([10]) == 1 and pool.match_blocks([1]) == 1

    # nothing idle left: any further allocation is refused
    assert pool.try_allocate([8], 1) == (None, [])

    pool.free(r1)
    assert pool.eviction_order() == [10]
    pool.free(r4)
    assert pool.eviction_order() == [10, 1]  # r4 held only block 1 in the cache


def test_refused_allocation_changes_nothing():
    pool = BlockPool(4)
    pool.free(admit_and_register(pool, [1, 2], 2))
    before = state(pool)
    assert before == (0, 2, 2, [2, 1])
    # reuses idle block 1 (not evictable for itself): room = 2 free + 2 idle − 1 = 3 < 5 needed
    assert pool.try_allocate([1, 5, 6, 7], 6) == (None, [])
    assert state(pool) == before  # 1 was not re-referenced or moved in the LRU
    # 4 needed: 2 free + 2 idle would do, but idle block 1 is the one being reused → refused
    assert pool.try_allocate([1, 5, 6], 5) == (None, [])
    assert state(pool) == before
    # needing exactly 3 fits: 1 is reused, 2 is the only block evicted
    allocation, evicted = pool.try_allocate([1, 5], 4)
    assert evicted == [2]
    assert (allocation.reused_blocks, allocation.private_blocks) == (1, 3)
    assert state(pool) == (4, 0, 0, [])


def test_refused_when_evicting_every_idle_block_is_not_enough():
    pool = BlockPool(6)
    running = admit_and_register(pool, [1, 2], 3)  # 2 cached + 1 private, running
    pool.free(admit_and_register(pool, [3], 1))  # 1 idle
    before = state(pool)
    assert before == (3, 1, 2, [3])
    assert pool.try_allocate([4, 5], 4) == (None, [])  # 2 free + 1 idle < 4
    assert state(pool) == before
    assert running.cached_hashes == [1, 2]
    allocation, evicted = pool.try_allocate([4, 5], 3)  # 2 free + 1 idle == 3
    assert evicted == [3] and allocation.private_blocks == 3
    assert state(pool) == (6, 0, 0, [])


def test_shared_prefix_is_refcounted():
    pool = BlockPool(8)
    a = admit_and_register(pool, [1, 2], 3)
    b, evicted = pool.try_allocate([1, 2, 3], 4)  # reuses the running request's blocks
    assert evicted == [] and (b.reused_blocks, b.private_blocks, b.cached_hashes) == (2, 2, [1, 2])
    assert pool.register_prefill(b, [1, 2, 3]) == [3]  # only the new block is stored
    assert (b.private_blocks, b.cached_hashes) == (1, [1, 2, 3])
    # refcounted blocks 1, 2, 3 + a's and b's private blocks
    assert state(pool) == (5, 0, 3, [])
    pool.free(a)
    assert state(pool) == (4, 0, 4, [])  # 1 and 2 still held by b: not idle
    pool.free(b)
    assert state(pool) == (0, 3, 5, [3, 2, 1])


def test_the_watched_idle_count_follows_blocks_that_idle_are_reused_and_are_evicted():
    pool = BlockPool(6)
    pool.watch([1, 2, 9], +1)
    pool.watch([1], +1)  # two watchers of 1
    first = admit_and_register(pool, [1, 2, 3], 3)
    assert pool.watched_idle_blocks == 0  # held
    pool.free(first)  # 1, 2, 3 idle; 1 and 2 watched
    assert pool.watched_idle_blocks == 2
    twin = pool.fork()
    pool.watch([1], -1)
    assert pool.watched_idle_blocks == 2  # 1 keeps a watcher
    pool.watch([1], -1)
    assert pool.watched_idle_blocks == 1
    admit_and_register(pool, [2], 1)  # reused: held again
    assert pool.watched_idle_blocks == 0
    assert twin.watched_idle_blocks == 2  # the fork is independent
    twin.try_allocate([], 5)  # 3 free blocks, so 2 of the 3 idle ones go: LRU frees tail first, 3 then 2
    assert (twin.watched_idle_blocks, twin.eviction_order()) == (1, [1])
    pool.watch([3], +1)  # watching an idle block counts it at once
    assert pool.watched_idle_blocks == 1


@pytest.mark.parametrize(
    ("hashes", "delta", "message"), [([5], -1, "block hash 5 is not watched"), ([5], 2, "delta = 2")]
)
def test_watch_refuses_an_unknown_unwatch_and_a_delta_other_than_one(hashes, delta, message):
    pool = BlockPool(4)
    with pytest.raises(ValueError, match=message):
        pool.watch(hashes, delta)
    assert pool.watched_idle_blocks == 0


def test_block_computed_twice_concurrently_is_shared_after_prefill():
    pool = BlockPool(8)
    a, _ = pool.try_allocate([1, 2], 3)
    b, _ = pool.try_allocate([1, 2], 3)  # a has not registered yet: no reuse
    assert b.reused_blocks == 0
    assert state(pool) == (6, 0, 2, [])
    assert pool.register_prefill(a, [1, 2]) == [1, 2]
    assert pool.register_prefill(b, [1, 2]) == []  # b's private copies are released
    assert (b.private_blocks, b.cached_hashes) == (1, [1, 2])
    assert state(pool) == (4, 0, 4, [])
    pool.free(a)
    assert state(pool) == (3, 0, 5, [])
    pool.free(b)
    assert state(pool) == (0, 2, 6, [2, 1])


def test_cache_disabled_matches_nothing_and_retains_nothing():
    pool = BlockPool(4, cache_enabled=False)
    a, evicted = pool.try_allocate([1, 2], 3)
    assert evicted == [] and a.reused_blocks == 0
    assert pool.register_prefill(a, [1, 2]) == []
    assert (a.private_blocks, a.cached_hashes) == (3, [])
    assert pool.match_blocks([1, 2]) == 0  # not even while it runs
    b, _ = pool.try_allocate([1, 2], 1)
    assert b.reused_blocks == 0
    assert state(pool) == (4, 0, 0, [])
    pool.free(a)
    pool.free(b)
    assert state(pool) == (0, 0, 4, [])
    assert pool.match_blocks([1, 2]) == 0
