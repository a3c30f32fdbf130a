"""ChunkRanker: chains inferred from a key-only event stream, orphans first, the leaf rule, pins, errors."""

import math

import numpy as np
import pytest

from kvcost.eviction import make_eviction_policy
from kvcost.eviction.chunks import ChunkRanker


class Clock:
    """A settable clock: ``clock.t = …`` before each event."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def ranker(policy: str = "gdsf", saved=(1.0, 2.0, 3.0, 4.0), **kwargs) -> tuple[ChunkRanker, Clock]:
    clock = Clock()
    return ChunkRanker(make_eviction_policy(policy), np.array(saved), clock=clock, **kwargs), clock


def put(r: ChunkRanker, clock: Clock, at_s: float, *keys: str) -> None:
    """``keys`` stored one after another from ``at_s`` (1 ms apart: one request's chain)."""
    for i, key in enumerate(keys):
        clock.t = at_s + 0.001 * i
        r.on_put(key)


def chain(r: ChunkRanker, key: str) -> tuple[int, object]:
    chunk = r._chunks[key]
    return chunk.depth, chunk.parent


def test_puts_close_together_form_one_chain_and_a_gap_starts_another():
    r, clock = ranker()
    put(r, clock, 0.0, "a0", "a1", "a2")
    put(r, clock, 1.0, "b0")
    assert [chain(r, k) for k in ("a0", "a1", "a2", "b0")] == [(0, None), (1, "a0"), (2, "a1"), (0, None)]


def test_a_store_after_a_hit_run_extends_the_deepest_chunk_touched():
    r, clock = ranker()
    put(r, clock, 0.0, "a0", "a1", "a2")
    for i, key in enumerate(("a1", "a0")):  # LMCache touches the hits deepest first
        clock.t = 5.0 + 0.001 * i
        r.on_hit(key)
    put(r, clock, 5.002, "c2")
    assert chain(r, "c2") == (2, "a1")
    assert r._chunks["a0"].hits == 1 and r._chunks["a2"].hits == 0


def test_orphans_of_a_removed_chunk_go_first_whatever_their_value():
    r, clock = ranker(saved=(1.0, 100.0, 100.0, 100.0))
    put(r, clock, 0.0, "x0")
    put(r, clock, 1.0, "a0", "a1", "a2", "a3")
    r.on_remove("a1")  # a2 and a3 can never be hit again
    clock.t = 2.0
    sizes = dict.fromkeys(("x0", "a0", "a2", "a3"), 1.0)
    assert r.candidates(3, sizes) == ["a3", "a2", "x0"]


def test_gdsf_keeps_a_hit_chunk_and_inflates_by_what_it_evicts():
    r, clock = ranker(saved=(1.0, 1.0))
    put(r, clock, 0.0, "a0")
    put(r, clock, 1.0, "b0")
    clock.t = 2.0
    r.on_hit("a0")
    clock.t = 3.0
    assert r.candidates(1, {"a0": 1.0, "b0": 1.0}) == ["b0"]
    assert r.policy.inflation == 1.0  # (0 hits + 1) × 1 s ÷ 1 byte


def test_a_parent_never_goes_before_its_stored_child():
    r, clock = ranker(saved=(0.1, 5.0, 5.0))
    put(r, clock, 0.0, "a0", "a1", "a2")
    put(r, clock, 1.0, "b0")
    clock.t = 2.0
    sizes = dict.fromkeys(("a0", "a1", "a2", "b0"), 1.0)
    assert r.candidates(4, sizes) == ["b0", "a2", "a1", "a0"]


def test_pinned_chunks_stay_and_fewer_come_back_when_fewer_can_go():
    r, clock = ranker()
    put(r, clock, 0.0, "a0")
    put(r, clock, 1.0, "b0")
    clock.t = 2.0
    sizes = {"a0": 1.0, "b0": 1.0}
    assert r.candidates(2, sizes, evictable=lambda key: key != "a0") == ["b0"]
    assert len(r) == 1


def test_a_chunk_the_store_no_longer_holds_is_forgotten():
    r, clock = ranker()
    put(r, clock, 0.0, "a0")
    put(r, clock, 1.0, "b0")
    clock.t = 2.0
    assert r.candidates(1, {"b0": 1.0}) == ["b0"] and len(r) == 0


def test_a_ranking_is_reused_within_the_interval_and_skips_chunks_touched_since():
    r, clock = ranker("lru", rerank_interval_s=10.0)
    put(r, clock, 0.0, "a0")
    put(r, clock, 1.0, "b0")
    put(r, clock, 2.0, "c0")
    sizes = dict.fromkeys(("a0", "b0", "c0"), 1.0)
    clock.t = 3.0
    assert r.candidates(1, sizes) == ["a0"]
    clock.t = 4.0
    r.on_hit("b0")  # its entry in the ranking is stale now
    assert r.candidates(1, sizes) == ["c0"]


def test_unknown_keys_are_ignored():
    r, clock = ranker()
    r.on_hit("never-stored")
    r.on_remove("never-stored")
    assert len(r) == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prefill_saved_s": np.array([])}, "prefill_saved_s = array([], dtype=float64), expected a non-empty"),
        ({"prefill_saved_s": np.array([-1.0])}, "expected a non-empty 1-D array of seconds ≥ 0"),
        ({"flops_saved": np.zeros(3)}, "flops_saved has shape (3,), expected (1,) like prefill_saved_s"),
        ({"restore_s": -1.0}, "restore_s = -1.0, expected seconds ≥ 0 (inf = dropped)"),
        ({"chain_window_s": 0.0}, "chain_window_s = 0.0, expected a finite number of seconds > 0"),
        ({"rerank_interval_s": math.inf}, "rerank_interval_s = inf, expected a finite number of seconds > 0"),
    ],
)
def test_bad_settings_name_the_field_and_what_was_expected(kwargs, message):
    args = {"policy": make_eviction_policy("gdsf"), "prefill_saved_s": np.array([1.0]), **kwargs}
    with pytest.raises(ValueError, match=None) as error:
        ChunkRanker(**args)
    assert message in str(error.value)


def test_asking_for_no_chunk_is_an_error():
    r, _ = ranker()
    with pytest.raises(ValueError, match="n = 0, expected an integer ≥ 1"):
        r.candidates(0, {})
