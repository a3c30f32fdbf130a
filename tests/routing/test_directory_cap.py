"""Tests for the cap on the blocks one worker may hold in kvcost.routing.directory.CacheDirectory."""

import pytest

from kvcost.core.types import Namespace
from kvcost.routing.directory import CacheDirectory

NS = Namespace("llama-3-8b")
SALTED = Namespace("llama-3-8b", cache_salt="tenantA")


def held(d, hashes, worker_id=0, namespace=NS):
    return [h for h in hashes if worker_id in d.holders(namespace, h)]


def test_past_the_cap_the_oldest_stored_blocks_are_dropped_and_counted():
    d = CacheDirectory(max_blocks_per_worker=4)
    d.apply_stored(NS, 0, [1, 2, 3], parent_hash=None, tier="gpu", now_s=1.0)
    d.apply_stored(NS, 0, [10, 11, 12], parent_hash=None, tier="gpu", now_s=2.0)
    assert held(d, [1, 2, 3, 10, 11, 12]) == [3, 10, 11, 12]
    assert (d.blocks_held(0), d.capped_blocks) == (4, {0: 2})
    assert d.match(NS, [10, 11, 12], [0], now_s=3.0)[0].reusable_blocks == 3


def test_removed_blocks_free_room_and_another_tier_is_not_a_new_block():
    d = CacheDirectory(max_blocks_per_worker=4)
    d.apply_stored(NS, 0, [1, 2, 3, 4], parent_hash=None, tier="gpu", now_s=1.0)
    d.apply_stored(NS, 0, [1, 2], parent_hash=None, tier="cpu", now_s=1.5)  # same blocks, one more tier
    d.apply_removed(NS, 0, [3, 4], now_s=2.0)
    d.apply_stored(NS, 0, [5, 6], parent_hash=2, tier="gpu", now_s=3.0)
    assert held(d, [1, 2, 3, 4, 5, 6]) == [1, 2, 5, 6]
    assert (d.blocks_held(0), d.capped_blocks) == (4, {})


def test_the_cap_is_per_worker_and_keeps_other_holders_and_namespaces_in_store_order():
    d = CacheDirectory(max_blocks_per_worker=3)
    d.apply_stored(NS, 1, [1, 2], parent_hash=None, tier="gpu", now_s=0.5)
    d.apply_stored(NS, 0, [1, 2], parent_hash=None, tier="gpu", now_s=1.0)
    d.apply_stored(SALTED, 0, [7], parent_hash=None, tier="gpu", now_s=2.0)
    d.apply_stored(NS, 0, [3, 4], parent_hash=2, tier="gpu", now_s=3.0)
    assert held(d, [1, 2, 3, 4]) == [3, 4] and held(d, [7], namespace=SALTED) == [7]
    assert held(d, [1, 2], worker_id=1) == [1, 2]  # worker 1's copies are its own
    assert d.capped_blocks == {0: 2} and d.blocks_held(1) == 2


def test_approximate_records_are_capped_too():
    d = CacheDirectory(max_blocks_per_worker=2)
    d.record_routed(NS, 0, [1, 2], now_s=1.0)
    d.record_routed(NS, 0, [5, 6], now_s=2.0)
    assert held(d, [1, 2, 5, 6]) == [5, 6]
    assert d.expire_routed(now_s=100.0, ttl_s=1.0) == 2  # only the two records left expire
    assert d.blocks_held(0) == 0


def test_the_order_stays_bounded_under_churn_and_a_clear_resets_it():
    d = CacheDirectory(max_blocks_per_worker=100)
    for i in range(5000):  # each block stored then removed: the order must not keep 5,000 dead entries
        d.apply_stored(NS, 0, [i], parent_hash=None, tier="gpu", now_s=float(i))
        d.apply_removed(NS, 0, [i], now_s=float(i))
    d.apply_stored(NS, 0, [1, 2], parent_hash=None, tier="gpu", now_s=6000.0)
    d.apply_stored(NS, 0, [2], parent_hash=None, tier="cpu", now_s=6001.0)
    order = d._order[0]
    assert order.held == d.blocks_held(0) == 2 and order.entries <= 2 * 2 + 1024
    d.clear_worker(0, now_s=7000.0)
    assert d.blocks_held(0) == 0 and 0 not in d._order


@pytest.mark.parametrize("cap", [0, -1, 2.5, None])
def test_a_cap_below_one_is_refused(cap):
    with pytest.raises(ValueError, match=f"max_blocks_per_worker = {cap!r}, expected an integer ≥ 1"):
        CacheDirectory(max_blocks_per_worker=cap)
