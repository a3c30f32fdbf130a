"""Tests for kvcost.routing.directory (CacheDirectory, Namespace, DirectoryMatch, reusable_tokens_for)."""

import math

import pytest

from kvcost.core.types import DirectoryMatch, Namespace, reusable_tokens_for
from kvcost.routing.directory import CacheDirectory

NS = Namespace("llama-3-8b")


def depths(directory, hashes, worker_ids=(0, 1, 2), namespace=NS, now_s=10.0):
    return [m.reusable_blocks for m in directory.match(namespace, hashes, list(worker_ids), now_s)]


def test_longest_prefix_per_worker_and_tier_of_deepest_block():
    d = CacheDirectory()
    d.apply_stored(NS, 0, [1, 2, 3], parent_hash=None, tier="gpu", now_s=1.0)
    d.apply_stored(NS, 1, [1], parent_hash=None, tier="gpu", now_s=2.0)
    d.apply_stored(NS, 1, [2], parent_hash=1, tier="cpu", now_s=2.5)
    matches = d.match(NS, [1, 2, 3, 4], [0, 1, 2], now_s=4.0)
    assert matches == [
        DirectoryMatch(0, 3, "gpu", 3.0),
        DirectoryMatch(1, 2, "cpu", 1.5),
        DirectoryMatch(2, 0, "none", math.inf),
    ]
    assert [m.tier_code for m in matches] == [1, 2, 0]
    assert d.num_blocks(NS) == 3


def test_match_stops_at_first_miss():
    d = CacheDirectory()
    d.apply_stored(NS, 0, [1, 2, 3], parent_hash=None, tier="gpu", now_s=0.0)
    d.apply_removed(NS, 0, [2], now_s=1.0)
    # block 3 is still held, but block 2 is missing: the prefix ends at block 1
    assert depths(d, [1, 2, 3]) == [1, 0, 0]
    # a request whose first block is unknown matches nothing, whatever follows
    assert depths(d, [99, 1, 3]) == [0, 0, 0]


def test_removal_keeps_other_holders_and_deletes_orphans():
    d = CacheDirectory()
    d.apply_stored(NS, 0, [1, 2], parent_hash=None, tier="gpu", now_s=0.0)
    d.apply_stored(NS, 1, [1], parent_hash=None, tier="gpu", now_s=0.0)
    d.apply_removed(NS, 0, [1, 2], now_s=1.0)
    assert depths(d, [1, 2]) == [0, 1, 0]
    assert d.num_blocks(NS) == 1  # block 2 had no other holder
    d.apply_removed(NS, 1, [1, 7], now_s=2.0)  # unknown hash 7 is ignored
    assert d.num_blocks() == 0


def test_match_tiers_counts_leading_blocks_by_tier_depth():
    d = CacheDirectory()
    d.apply_stored(NS, 0, [1, 2], parent_hash=None, tier="gpu", now_s=0.0)
    d.apply_stored(NS, 0, [1, 2, 3], parent_hash=None, tier="cpu", now_s=0.0)  # demoted copies
    d.apply_stored(NS, 0, [4], parent_hash=3, tier="disk", now_s=0.0)
    d.apply_stored(NS, -1, [1, 2, 3, 4, 5], parent_hash=None, tier="remote", now_s=0.0)  # the remote store
    d.apply_stored(NS, 1, [2], parent_hash=None, tier="gpu", now_s=0.0)  # not a prefix: block 1 missing
    assert d.match_tiers(NS, [1, 2, 3, 4, 5, 6], [0, 1, -1, 2]) == {
        0: (2, 3, 4),
        1: (0, 0, 0),
        -1: (0, 0, 5),
        2: (0, 0, 0),
    }
    # dropping only the GPU tier leaves the CPU copies reusable
    d.apply_removed(NS, 0, [2], now_s=1.0, tier="gpu")
    assert d.match_tiers(NS, [1, 2, 3], [0])[0] == (1, 3, 3)
    with pytest.raises(ValueError, match="tier = 'hbm'"):
        d.apply_removed(NS, 0, [1], now_s=1.0, tier="hbm")


def test_clear_worker_in_every_namespace():
    other = Namespace("llama-3-8b", adapter="sql-lora")
    d = CacheDirectory()
    d.apply_stored(NS, 0, [1, 2], parent_hash=None, tier="gpu", now_s=0.0)
    d.apply_stored(other, 0, [1], parent_hash=None, tier="disk", now_s=0.0)
    d.apply_stored(NS, 1, [1], parent_hash=None, tier="gpu", now_s=0.0)
    d.clear_worker(0, now_s=5.0)
    assert depths(d, [1, 2]) == [0, 1, 0]
    assert depths(d, [1], namespace=other) == [0, 0, 0]
    assert d.num_blocks() == 1
    # clearing counts as hearing from the worker
    assert d.match(NS, [1], [0], now_s=7.0)[0].age_s == 2.0


def test_clear_worker_gpu_tier_keeps_lower_tiers_and_the_stale_flag_until_nothing_is_held():
    d = CacheDirectory()
    d.apply_stored(NS, 0, [1, 2], parent_hash=None, tier="gpu", now_s=0.0)
    d.apply_stored(NS, 0, [1], parent_hash=None, tier="cpu", now_s=0.0)
    d.mark_stale(0)
    d.clear_worker(0, now_s=1.0, tier="gpu")
    assert d.holders(NS, 1) == {0: ("cpu",)}
    assert d.holders(NS, 2) == {}
    assert d.is_stale(0)  # the CPU copies may still be wrong
    d.clear_worker(0, now_s=2.0, tier="cpu")
    assert d.num_blocks() == 0 and not d.is_stale(0)
    with pytest.raises(ValueError, match="tier = 'hbm'"):
        d.clear_worker(0, now_s=3.0, tier="hbm")


@pytest.mark.parametrize(
    "other",
    [
        Namespace("llama-3-8b", revision="v2"),
        Namespace("llama-3-8b", adapter="sql-lora"),
        Namespace("llama-3-8b", block_size_tokens=256),
        Namespace("llama-3-8b", kv_layout="fp8-tp2"),
        Namespace("llama-3-8b", cache_salt="tenant-b"),
        Namespace("llama-2-7b"),
    ],
)
def test_namespaces_are_isolated(other):
    d = CacheDirectory()
    d.apply_stored(NS, 0, [1, 2], parent_hash=None, tier="gpu", now_s=0.0)
    assert depths(d, [1, 2], namespace=other) == [0, 0, 0]
    assert depths(d, [1, 2], namespace=NS) == [2, 0, 0]
    assert d.num_blocks(other) == 0


def test_age_is_time_since_last_event_of_the_worker():
    d = CacheDirectory()
    d.apply_stored(NS, 0, [1], parent_hash=None, tier="gpu", now_s=1.0)
    d.apply_removed(NS, 1, [42], now_s=3.5)  # any event refreshes the worker, even a no-op
    ages = [m.age_s for m in d.match(NS, [1], [0, 1, 2], now_s=4.0)]
    assert ages == [3.0, 0.5, math.inf]


@pytest.mark.parametrize("tier", ["ssd", "none", "GPU"])
def test_unknown_tier_is_rejected(tier):
    d = CacheDirectory()
    with pytest.raises(ValueError) as err:
        d.apply_stored(NS, 0, [1], parent_hash=None, tier=tier, now_s=0.0)
    assert str(err.value) == f"tier = {tier!r}, expected one of gpu, cpu, disk, remote"
    assert d.num_blocks() == 0


def test_empty_request_and_empty_directory():
    d = CacheDirectory()
    assert d.match(NS, [], [3], now_s=0.0) == [DirectoryMatch(3, 0, "none", math.inf)]
    assert depths(d, [1, 2]) == [0, 0, 0]


@pytest.mark.parametrize(
    "blocks, input_tokens, expected",
    [
        (0, 100, 0),
        (1, 1024, 512),
        (2, 1024, 1023),  # fully cached prompt: the last token is still computed
        (3, 1024, 1023),  # stale directory claiming more blocks than the prompt has
        (2, 1, 0),
    ],
)
def test_reusable_tokens_capped_at_input_minus_one(blocks, input_tokens, expected):
    assert reusable_tokens_for(blocks, 512, input_tokens) == expected


def test_an_unknown_worker_matches_nothing_until_known_again_or_cleared():
    d = CacheDirectory()
    d.apply_stored(NS, 0, [1, 2, 3], None, "gpu", now_s=1.0)
    d.apply_stored(NS, 1, [1, 2], None, "cpu", now_s=1.0)
    d.mark_unknown(0)
    (m0, m1) = d.match(NS, [1, 2, 3], [0, 1], now_s=2.0)
    assert (m0.reusable_blocks, m0.tier, m0.stale) == (0, "none", True)
    assert (m1.reusable_blocks, m1.stale) == (2, False)
    assert d.match_tiers(NS, [1, 2, 3], [0, 1]) == {0: (0, 0, 0), 1: (0, 2, 2)}
    d.mark_known(0)  # the same process answers again: its entries count again
    assert (d.match(NS, [1, 2, 3], [0], now_s=2.0)[0].reusable_blocks, d.is_unknown(0)) == (3, False)
    d.mark_unknown(0)
    d.clear_worker(0, now_s=3.0)  # a new process: its entries are dropped, the view is exact (empty)
    d.apply_stored(NS, 0, [1], None, "gpu", now_s=4.0)
    m0 = d.match(NS, [1, 2, 3], [0], now_s=4.0)[0]
    assert (m0.reusable_blocks, m0.stale, d.is_unknown(0)) == (1, False, False)
