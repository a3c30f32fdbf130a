"""The ``clairvoyant`` reference: next-use lookups on a hand-made trace, its value and order, and that the
service and an engine's cache never run it."""

import math

import numpy as np
import pytest

from kvcost.eviction import (
    EVICTION_POLICIES,
    EvictionContext,
    NextUseTable,
    deployable_policies,
    make_eviction_policy,
    rank_nodes,
)
from kvcost.eviction.clairvoyant import MIN_GAP_S
from kvcost.eviction.index import EvictionIndex
from kvcost.eviction.prefill import BlockCostTable
from tests.eviction.test_policies import table

#: Four requests: block 1 arrives at 0, 1 and 5; block 2 at 0 and 5; block 3 at 2.
FUTURE = NextUseTable([0.0, 1.0, 2.0, 5.0], [[1, 2], [1], [3], [1, 2]])


@pytest.mark.parametrize(
    ("now_s", "expected"),
    [
        (-10.0, [0.0, 0.0, 2.0, math.inf, math.inf]),
        (0.0, [1.0, 5.0, 2.0, math.inf, math.inf]),  # strictly after now: the arrival at 0 has passed
        (1.5, [5.0, 5.0, 2.0, math.inf, math.inf]),
        (5.0, [math.inf] * 5),
        (1e9, [math.inf] * 5),
    ],
)
def test_next_use_is_the_first_later_arrival_that_carries_the_block(now_s, expected):
    assert FUTURE.next_use_s(np.array([1, 2, 3, 4, -1]), now_s).tolist() == expected


def test_next_use_of_an_empty_table_or_query():
    assert NextUseTable([], []).next_use_s(np.array([1]), 0.0).tolist() == [math.inf]
    assert FUTURE.next_use_s(np.array([], dtype=np.int64), 0.0).tolist() == []


def test_next_use_table_errors_name_the_field():
    with pytest.raises(ValueError, match="arrivals_s has 2 entries and block_hashes 1, expected one per request"):
        NextUseTable([0.0, 1.0], [[1]])
    with pytest.raises(ValueError, match="block_hashes contains -3, expected non-negative integers"):
        NextUseTable([0.0], [[1, -3]])
    with pytest.raises(ValueError, match="arrivals_s contains a non-finite time"):
        NextUseTable([math.nan], [[1]])


def test_clairvoyant_value_is_seconds_saved_per_byte_per_second_to_the_next_use():
    policy = make_eviction_policy("clairvoyant", EvictionContext(next_use=FUTURE))
    nodes = table(block_hash=[1, 3, 4, 2], prefill_saved_s=[2.0, 2.0, 9.0, 1.0], size_bytes=[1.0, 1.0, 1.0, 2.0])
    ranking = rank_nodes(policy, nodes, now_s=0.0)
    # gaps 1, 2, none, 5 s → values 2/1/1, 2/1/2, 0, 1/2/5
    assert ranking.terms["value"].tolist() == [2.0, 1.0, 0.0, 0.1]
    assert ranking.terms["p_reuse"].tolist() == [1.0, 1.0, 0.0, 1.0]
    assert ranking.order.tolist() == [2, 3, 1, 0]
    due_now = rank_nodes(policy, table(block_hash=[1]), now_s=1.0 - MIN_GAP_S / 2)
    assert due_now.terms["value"].tolist() == [1.0 / 100.0 / MIN_GAP_S]  # the gap's floor


def test_clairvoyant_without_the_future_is_refused_and_never_deployed():
    with pytest.raises(ValueError, match="EvictionContext.next_use is None, expected a NextUseTable"):
        make_eviction_policy("clairvoyant")
    assert "clairvoyant" in EVICTION_POLICIES
    assert deployable_policies() == [name for name in EVICTION_POLICIES if name != "clairvoyant"]


def test_the_index_hands_the_block_hash_to_the_policy():
    policy = make_eviction_policy("clairvoyant", EvictionContext(next_use=FUTURE))
    costs = BlockCostTable(prefill_saved_s=np.ones(8), flops_saved=np.ones(8), size_bytes=1.0, restore_s=math.inf)
    index = EvictionIndex(policy, costs, capacity_blocks=4, rerank_interval_s=10.0)
    for block_hash in (3, 1):
        index.on_stored(block_hash, None, 0, now_s=0.0)
    index.on_idle([3, 1], request_blocks=1, now_s=0.0)
    assert index.table(np.array([0, 1])).block_hash.tolist() == [3, 1]
    assert index.pop(0.5) == 3  # next use at 2 s is farther than block 1's at 1 s
