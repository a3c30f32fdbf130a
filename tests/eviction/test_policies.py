"""Eviction policies on hand-made node tables: exact orders and value terms, leaf rule, registry."""

import math

import numpy as np
import pytest

from kvcost.eviction import EVICTION_POLICIES, EvictionContext, NodeTable, make_eviction_policy, rank_nodes
from kvcost.eviction.base import subtree_max
from kvcost.eviction.cost_aware import seconds_lost


def table(**cols) -> NodeTable:
    """Four unrelated nodes by default; override any column."""
    n = len(next(iter(cols.values()))) if cols else 4
    base = dict(
        depth_blocks=np.zeros(n, dtype=np.int64),
        hits=np.zeros(n, dtype=np.int64),
        last_access_s=np.zeros(n),
        created_s=np.zeros(n),
        size_bytes=np.full(n, 100.0),
        prefill_saved_s=np.ones(n),
        restore_s=np.full(n, math.inf),
        flops_saved=np.ones(n),
        category=np.zeros(n, dtype=np.int64),
        request_blocks=np.ones(n, dtype=np.int64),
    )
    return NodeTable(**(base | {k: np.asarray(v) for k, v in cols.items()}))


def test_registry_has_the_seven_policies_and_refuses_duplicates():
    assert EVICTION_POLICIES.names() == ["clairvoyant", "cost_aware", "flop_aware", "gdsf", "lfu", "lhd", "lru"]
    with pytest.raises(ValueError, match="duplicate eviction policy name 'lru'"):
        EVICTION_POLICIES.add("lru", object)
    with pytest.raises(KeyError, match="unknown eviction policy 'fifo'"):
        make_eviction_policy("fifo")


def test_lru_oldest_first_ties_deeper_first_and_ignores_the_tree():
    nodes = table(last_access_s=[5.0, 1.0, 1.0, 3.0], depth_blocks=[0, 0, 1, 1], parent=[-1, -1, 1, 0])
    ranking = rank_nodes(make_eviction_policy("lru"), nodes, now_s=10.0)
    assert ranking.order.tolist() == [2, 1, 3, 0]  # at 1.0: the deeper (tail) first; then 3.0, 5.0
    assert ranking.terms["value"].tolist() == [5.0, 1.0, 1.0, 3.0]


def test_lfu_fewest_hits_first():
    nodes = table(hits=[3, 0, 1, 0], last_access_s=[0.0, 2.0, 0.0, 1.0])
    assert rank_nodes(make_eviction_policy("lfu"), nodes, 5.0).order.tolist() == [3, 1, 2, 0]


def test_gdsf_value_inflation_and_order():
    policy = make_eviction_policy("gdsf")
    nodes = table(hits=[0, 1, 0, 3], prefill_saved_s=[1.0, 1.0, 4.0, 0.5], size_bytes=[1.0, 1.0, 2.0, 1.0])
    ranking = rank_nodes(policy, nodes, 0.0)
    # H = L + (hits + 1) × cost / size = [1, 2, 2, 2]; ties by last access (equal) then row
    assert ranking.terms["value"].tolist() == [1.0, 2.0, 2.0, 2.0]
    assert ranking.order.tolist() == [0, 1, 2, 3]
    policy.on_evict(1.0, 0, 0.0)
    assert rank_nodes(policy, nodes, 0.0).terms["value"].tolist() == [2.0, 3.0, 3.0, 3.0]


def test_lhd_prefers_to_keep_blocks_whose_age_class_gets_hits():
    policy = make_eviction_policy("lhd")
    for _ in range(50):
        policy.on_hit(hits=1, idle_age_s=1.5)  # reused blocks come back after ~1.5 s
        policy.on_evict(0.0, hits=0, idle_age_s=1.5)  # never-hit blocks are evicted at that age
    nodes = table(hits=[0, 2], last_access_s=[9.0, 9.0])  # both idle 1 s
    ranking = rank_nodes(policy, nodes, now_s=10.0)
    assert ranking.order.tolist() == [0, 1]
    assert ranking.terms["value"][1] > 2 * ranking.terms["value"][0]


def test_flop_aware_recency_plus_alpha_flop_efficiency():
    nodes = table(last_access_s=[0.0, 10.0, 5.0], flops_saved=[100.0, 0.0, 50.0], size_bytes=[1.0, 1.0, 1.0])
    ranking = rank_nodes(make_eviction_policy("flop_aware", EvictionContext(flop_alpha=0.5)), nodes, 10.0)
    assert ranking.terms["value"].tolist() == [0.5, 1.0, 0.75]
    assert ranking.order.tolist() == [0, 2, 1]


class FixedReuse:
    """A reuse model returning fixed probabilities."""

    def __init__(self, p):
        self.p = np.asarray(p, dtype=float)

    def predict_proba(self, nodes, now_s):
        return self.p


def test_cost_aware_value_terms_and_the_minus_restore_rule():
    nodes = table(
        prefill_saved_s=[0.2, 0.5, 0.5, 0.1],
        restore_s=[math.inf, 0.05, math.inf, math.inf],
        size_bytes=[1.0, 1.0, 2.0, 1.0],
    )
    policy = make_eviction_policy("cost_aware", EvictionContext(reuse_model=FixedReuse([0.5, 1.0, 0.8, 1.0])))
    ranking = rank_nodes(policy, nodes, 0.0)
    np.testing.assert_allclose(ranking.terms["value"], [0.1, 0.05, 0.2, 0.1])
    assert ranking.terms["p_reuse"].tolist() == [0.5, 1.0, 0.8, 1.0]
    assert ranking.order.tolist() == [1, 0, 3, 2]
    assert seconds_lost(np.array([0.5, 0.5]), np.array([0.05, math.inf])).tolist() == [0.05, 0.5]


def test_cost_aware_without_a_model_uses_the_recency_prior():
    nodes = table(last_access_s=[0.0, 100.0], prefill_saved_s=[1.0, 1.0], size_bytes=[1.0, 1.0])
    terms = rank_nodes(make_eviction_policy("cost_aware", EvictionContext(horizon_s=100.0)), nodes, 100.0).terms
    np.testing.assert_allclose(terms["p_reuse"], [math.exp(-1.0), 1.0])


def test_leaf_rule_parent_goes_after_its_children():
    # chain 0 ← 1 ← 2 (depths 0,1,2) and a lone leaf 3; the root has the lowest value
    nodes = table(
        depth_blocks=[0, 1, 2, 0],
        parent=[-1, 0, 1, -1],
        hits=[0, 5, 2, 3],
    )
    ranking = rank_nodes(make_eviction_policy("lfu"), nodes, 0.0)
    # greedy lowest-leaf: leaves {2: 2, 3: 3} → 2; then {1: 5, 3: 3} → 3; then 1; then 0
    assert ranking.order.tolist() == [2, 3, 1, 0]
    assert nodes.is_leaf().tolist() == [False, False, True, True]


@pytest.mark.parametrize("policy", ["lfu", "gdsf", "lhd", "flop_aware", "cost_aware"])
def test_a_child_stamped_later_than_its_parent_still_goes_first(policy):
    # equal values; the child (row 1) was stored after its parent (row 0) and never touched since
    nodes = table(depth_blocks=[0, 1], parent=[-1, 0], last_access_s=[100.0, 200.0], created_s=[100.0, 200.0])
    assert rank_nodes(make_eviction_policy(policy), nodes, 300.0).order.tolist() == [1, 0]


def test_subtree_max_and_bad_parent_depth():
    assert subtree_max(np.array([1.0, 5.0, 2.0]), np.array([-1, 0, 1]), np.array([0, 1, 2])).tolist() == [5, 5, 2]
    with pytest.raises(ValueError, match="smaller depth_blocks"):
        subtree_max(np.array([1.0, 2.0]), np.array([-1, 0]), np.array([1, 1]))


def test_node_table_shape_and_size_errors():
    with pytest.raises(ValueError, match=r"hits has shape \(2,\), expected \(4,\)"):
        table(depth_blocks=np.zeros(4, dtype=np.int64), hits=[0, 0])
    with pytest.raises(ValueError, match="size_bytes min = 0.0"):
        table(size_bytes=[1.0, 0.0])
    with pytest.raises(ValueError, match="now_s = nan"):
        rank_nodes(make_eviction_policy("lru"), table(), math.nan)


def test_context_validation():
    with pytest.raises(ValueError, match="horizon_s = 0, expected a finite number > 0"):
        EvictionContext(horizon_s=0)
