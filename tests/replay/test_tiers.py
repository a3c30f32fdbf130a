"""Tests for kvcost.replay.tiers: FIFO links with contention, LRU lower tiers, tier config."""

import pytest

from kvcost.core.links import LinkSpec
from kvcost.replay.tiers import Link, TierCache, TierConfig, WorkerTiers


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


def test_demotion_order_gpu_to_cpu_to_disk_then_dropped():
    tiers = WorkerTiers(TierConfig(cpu_bytes=2 * 40, disk_bytes=2 * 40, remote_bytes=0), block_bytes=40)
    assert tiers.put_cpu([1, 2]) == [("stored", "cpu", [1, 2])]
    assert tiers.put_cpu([3, 4]) == [
        ("stored", "cpu", [3, 4]),
        ("removed", "cpu", [1, 2]),
        ("stored", "disk", [1, 2]),
    ]
    assert tiers.put_cpu([5]) == [
        ("stored", "cpu", [5]),
        ("removed", "cpu", [3]),
        ("stored", "disk", [3]),
        ("removed", "disk", [1]),  # dropped for good
    ]
    assert (tiers.cpu.order(), tiers.disk.order()) == ([4, 5], [2, 3])
    assert tiers.match_below([9, 2, 3, 4, 5, 1], start=1) == (2, 2)  # 2, 3 on disk; 4, 5 in CPU; 1 gone


def test_loads_read_disk_first_then_share_the_pcie_link():
    config = TierConfig(cpu_bytes=400, disk_bytes=400, cpu_to_gpu=LinkSpec(400.0, 0.0), disk_to_cpu=LinkSpec(40.0, 0.0))
    tiers = WorkerTiers(config, block_bytes=40)
    assert tiers.load(1.0, [7], cpu_blocks=1, disk_blocks=0) == pytest.approx(1.1)  # 40 B at 400 B/s
    # 1 disk block: 1 s of NVMe, then 2 blocks over PCIe (free again at 1.1) → 2.0 + 0.2
    assert tiers.load(1.0, [8, 9], cpu_blocks=1, disk_blocks=1) == pytest.approx(2.2)
