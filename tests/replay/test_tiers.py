"""Tests for kvcost.replay.tiers: FIFO links with contention, LRU lower tiers, tier config."""

import pytest

from kvcost.models.links import LinkSpec
from kvcost.replay.tiers import Link, TierCache, TierConfig


def test_second_transfer_on_a_busy_link_waits_for_the_first():
    link = Link(LinkSpec(bandwidth_bytes_per_s=1e9, setup_s=0.01))
    first = link.reserve(0.0, 2e9)  # 0.01 + 2 s
    second = link.reserve(0.5, 1e9)  # requested while the first runs
    assert first == (0.0, 2.01)
    assert second == (2.01, pytest.approx(3.02))
    assert link.backlog_s(1.0) == pytest.approx(2.02)
    assert link.backlog_s(5.0) == 0.0


def test_transfers_on_an_idle_link_do_not_wait_and_zero_bytes_take_no_time():
    link = Link(LinkSpec(1e9, 0.01))
    assert link.reserve(1.0, 0) == (1.0, 1.0)
    assert link.reserve(3.0, 1e9) == (3.0, pytest.approx(4.01))
    assert link.reserve(10.0, 1e9) == (10.0, pytest.approx(11.01))
    assert link.bytes_moved == 2e9


def test_tier_cache_is_lru_and_returns_what_it_pushes_out():
    cpu = TierCache("cpu", capacity_blocks=3)
    assert cpu.put([1, 2, 3]) == []
    cpu.touch([1])
    assert cpu.put([4, 5]) == [2, 3]
    assert cpu.order() == [1, 4, 5]
    assert cpu.match_from([9, 1, 4, 7], start=1) == 2
    assert TierCache("disk", 0).put([1, 2]) == [1, 2]  # a disabled tier keeps nothing


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match=r"cpu_bytes = -1, expected an integer ≥ 0"):
        TierConfig(cpu_bytes=-1)
    with pytest.raises(ValueError, match=r"bandwidth_bytes_per_s = 0, expected a number > 0"):
        LinkSpec(0, 0.0)
    assert TierConfig(cpu_bytes=10, disk_bytes=25).capacity_blocks("disk", 8) == 3
