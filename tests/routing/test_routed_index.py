import pytest

from kvcost.routing.routed_index import InFlightPrefixes, RoutedPrefixIndex


def test_match_is_a_prefix_walk_per_worker():
    index = RoutedPrefixIndex()
    index.insert(0, [1, 2, 3], now_s=0.0)
    index.insert(1, [1, 7], now_s=0.0)
    assert index.match([1, 2, 3, 4], [0, 1, 2]) == [3, 1, 0]


def test_trim_drops_least_recently_routed_first():
    index = RoutedPrefixIndex()
    index.insert(0, [1, 2, 3], now_s=0.0)  # deepest first: LRU order 3, 2, 1
    index.insert(0, [1, 4], now_s=1.0)  # now 3, 2, 4, 1
    assert index.trim(max_blocks_per_worker=2) == 2
    assert index.match([1, 4], [0]) == [2]
    assert index.match([1, 2], [0]) == [1]  # the chain lost its leaf, kept its head
    assert index.size_blocks(0) == 2
    assert index.trim(max_blocks_per_worker=1, worker_id=0) == 1 and index.match([1, 4], [0]) == [1]


def test_expire_by_age():
    index = RoutedPrefixIndex()
    index.insert(0, [1, 2], now_s=0.0)
    index.insert(0, [3], now_s=5.0)
    assert index.expire(older_than_s=1.0) == 2
    assert index.size_blocks(0) == 1 and index.match([3], [0]) == [1]


def test_in_flight_prefixes_share_blocks_release_and_expire():
    index = InFlightPrefixes()
    index.add("ns", 0, [1, 2, 3], expires_s=2.0, request_id=1)
    index.add("ns", 0, [1, 2], expires_s=5.0, request_id=2)
    index.add("other", 0, [1, 2, 3], expires_s=5.0, request_id=3)
    assert index.match("ns", [1, 2, 3, 4], [0, 1]) == [3, 0]
    assert index.release(2) and not index.release(2)  # [1, 2]'s request started; released once
    assert index.match("ns", [1, 2, 3], [0]) == [3]
    assert index.expire(2.0) == 1  # expires_s ≤ now_s
    assert index.match("ns", [1, 2, 3], [0]) == [0] and not index.release(1)  # expired with its entry
    assert index.match("other", [1, 2, 3], [0]) == [3]
    assert len(index) == 1


def test_a_chain_two_queued_requests_carry_stays_until_both_have_started():
    index = InFlightPrefixes()
    index.add("ns", 0, [1, 2], expires_s=9.0, request_id=1)
    index.add("ns", 0, [1, 2], expires_s=9.5, request_id=2)
    assert len(index) == 1 and index.release(1)
    assert index.match("ns", [1, 2], [0]) == [2]  # request 2 will store the chain again if it was evicted
    assert index.release(2) and index.match("ns", [1, 2], [0]) == [0] and len(index) == 0


def test_a_released_chain_kept_for_a_grace_stays_until_then_and_a_new_request_extends_it():
    index = InFlightPrefixes()
    index.add("ns", 0, [1, 2], expires_s=9.0, request_id=1)
    assert index.release(1, keep_until_s=1.5) and index.match("ns", [1, 2], [0]) == [2]  # the event is on its way
    assert index.expire(1.4) == 0 and index.expire(1.5) == 1 and len(index) == 0
    index.add("ns", 0, [3], expires_s=9.0, request_id=2)
    index.release(2, keep_until_s=2.0)
    index.add("ns", 0, [3], expires_s=8.0, request_id=3)  # routed again within the grace: carried by request 3
    assert index.expire(2.0) == 0 and index.match("ns", [3], [0]) == [1]
    assert index.release(3) and len(index) == 0


def test_a_request_id_routed_again_names_the_newer_request_and_anonymous_entries_only_expire():
    index = InFlightPrefixes()
    index.add("ns", 0, [1, 2], expires_s=9.0, request_id=1)
    index.add("ns", 1, [5], expires_s=9.0, request_id=1)  # the id again: the first routing no longer counts
    assert index.match("ns", [1, 2], [0]) == [0] and index.match("ns", [5], [1]) == [1]
    index.add("ns", 0, [7], expires_s=3.0)
    index.add("ns", 0, [7], expires_s=3.0, request_id=2)
    assert index.release(2) and index.match("ns", [7], [0]) == [1]
    assert index.expire(3.0) == 1 and index.match("ns", [7], [0]) == [0]


def test_forget_worker_drops_its_entries_in_every_namespace_and_expiry_skips_them():
    index = InFlightPrefixes()
    index.add("a", 0, [1, 2], expires_s=5.0)
    index.add("b", 0, [7], expires_s=5.0)
    index.add("a", 1, [1, 2, 3], expires_s=5.0)
    assert index.forget_worker(0) == 2
    assert index.match("a", [1, 2, 3], [0, 1]) == [0, 3] and index.match("b", [7], [0]) == [0]
    assert index.expire(6.0) == 1 and len(index) == 0


def test_in_flight_prefixes_past_the_cap_drop_the_oldest_entries():
    index = InFlightPrefixes(max_blocks_per_worker=4)
    index.add("ns", 0, [1, 2], expires_s=5.0)
    index.add("ns", 0, [1, 2, 3], expires_s=6.0)  # shares blocks 1 and 2: 3 distinct blocks
    index.add("ns", 1, [8, 9], expires_s=6.0)
    index.add("ns", 0, [7, 8], expires_s=7.0)  # 5 distinct on worker 0: its oldest entries go until ≤ 4
    assert (index.match("ns", [1, 2, 3], [0]), index.match("ns", [7, 8], [0, 1])) == ([0], [2, 0])
    assert (len(index), index.capped_entries) == (2, 2)
    index.add("ns", 0, [20, 21, 22, 23, 24], expires_s=8.0)  # alone past the cap: the newest entry is kept
    assert (index.match("ns", [20, 21, 22, 23, 24], [0]), index.capped_entries) == ([5], 3)
    with pytest.raises(ValueError, match="max_blocks_per_worker = 0, expected an integer ≥ 1"):
        InFlightPrefixes(max_blocks_per_worker=0)


def test_in_flight_first_token_is_the_latest_per_block_and_leaves_with_the_last_entry_holding_it():
    index = InFlightPrefixes()
    index.add("ns", 0, [1, 2], expires_s=9.0, request_id=1, first_token_s=5.0)
    index.add("ns", 0, [1, 3], expires_s=9.0, request_id=2, first_token_s=3.0)
    index.add("ns", 0, [4], expires_s=9.0, request_id=3)  # no time given
    assert [index.first_token_s("ns", 0, b) for b in (1, 2, 3, 4)] == [5.0, 5.0, 3.0, None]
    assert [index.holders("ns", 0, b) for b in (1, 2, 3, 4, 5)] == [2, 1, 1, 1, 0]
    assert index.first_token_s("ns", 1, 1) is None and index.first_token_s("other", 0, 1) is None
    assert index.release(1)  # [1, 2] leaves: block 2 with it; block 1 keeps the latest time it had
    assert [index.first_token_s("ns", 0, b) for b in (1, 2, 3)] == [5.0, None, 3.0]
    assert index.release(2) and index.first_token_s("ns", 0, 1) is None
