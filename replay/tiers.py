"""Lower KV tiers and the links between them (docs/architecture.md §1, §2): CPU DRAM, local disk, a shared remote store.

Per worker the GPU block pool (:mod:`kvcost.replay.kv_cache`) is backed by a CPU
DRAM tier and a local-disk tier; all workers share one remote store (LMCache's
remote backend, Mooncake's store). Blocks evicted from the GPU are *demoted* to
CPU, blocks evicted from CPU to disk, blocks evicted from disk are dropped
(LMCache's local CPU → local disk hierarchy). The remote store is written
through: every block a worker computes is also put there (Mooncake store; LMCache
with a remote backend). Each lower tier keeps its blocks in LRU order.

Moving KV costs time on a :class:`Link`: ``setup_s + bytes / bandwidth``,
first come first served, so a second transfer on a busy link waits for the first
(contention is modelled). Stores (demotion, write-through) are not charged: they
are asynchronous copies in the device-to-host direction, while loads use the
host-to-device direction of the full-duplex PCIe link (an assumption: LMCache
overlaps stores with compute).

Link speeds are in :mod:`kvcost.core.links`. Default capacities (assumptions):
128 GiB of CPU DRAM and 1 TiB of disk per worker (a DGX H100 has 2 TB DRAM and
30 TB NVMe for 8 GPUs), a 4 TiB shared remote store.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kvcost.core.hardware import GIB_BYTES
from kvcost.core.links import CPU_TO_GPU, DISK_TO_CPU, NETWORK, LinkSpec

#: Lower tiers of a worker, fastest first (names of ``features.spec.TIER_CODES``).
LOCAL_TIERS: tuple[str, ...] = ("cpu", "disk")


class Link:
    """One FIFO data path (e.g. a worker's host-to-device PCIe direction).

    A transfer starts when both it is requested and the link is free, and holds
    the link for :meth:`LinkSpec.duration_s`.

    Example:
        >>> link = Link(LinkSpec(1e9, 0.001))
        >>> link.reserve(0.0, 1e9), link.reserve(0.5, 1e9)
        ((0.0, 1.001), (1.001, 2.002))
    """

    def __init__(self, spec: LinkSpec) -> None:
        self.spec = spec
        self.free_at_s = 0.0
        self.bytes_moved = 0.0

    def backlog_s(self, now_s: float) -> float:
        """Time a transfer requested at ``now_s`` would wait before starting, ≥ 0."""
        return max(0.0, self.free_at_s - now_s)

    def reserve(self, now_s: float, n_bytes: float) -> tuple[float, float]:
        """Queue a transfer of ``n_bytes`` requested at ``now_s``; returns its ``(start_s, end_s)``.

        Zero bytes take no time and do not wait: ``(now_s, now_s)``.
        """
        if n_bytes <= 0:
            return now_s, now_s
        start_s = max(now_s, self.free_at_s)
        self.free_at_s = start_s + self.spec.duration_s(n_bytes)
        self.bytes_moved += n_bytes
        return start_s, self.free_at_s


@dataclass(frozen=True, slots=True)
class TierConfig:
    """Capacities and links of the lower tiers (defaults: see the module docstring).

    Attributes:
        cpu_bytes, disk_bytes: per worker, ≥ 0 (0 disables the tier).
        remote_bytes: the shared remote store, ≥ 0 (0 disables it and transfers from it).
        cpu_to_gpu, disk_to_cpu, network: link specs.
    """

    cpu_bytes: int = 128 * GIB_BYTES
    disk_bytes: int = 1024 * GIB_BYTES
    remote_bytes: int = 4096 * GIB_BYTES
    cpu_to_gpu: LinkSpec = field(default=CPU_TO_GPU)
    disk_to_cpu: LinkSpec = field(default=DISK_TO_CPU)
    network: LinkSpec = field(default=NETWORK)

    def __post_init__(self) -> None:
        for name in ("cpu_bytes", "disk_bytes", "remote_bytes"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 0):
                raise ValueError(f"{name} = {value!r}, expected an integer ≥ 0")

    def capacity_blocks(self, tier: str, block_bytes: int) -> int:
        """Whole blocks of ``block_bytes`` that fit in ``tier`` (``cpu``, ``disk`` or ``remote``)."""
        return {"cpu": self.cpu_bytes, "disk": self.disk_bytes, "remote": self.remote_bytes}[tier] // block_bytes


class TierCache:
    """An LRU set of block hashes with a capacity in blocks (one lower tier of one worker, or the remote store).

    Args:
        name: tier name (``cpu``, ``disk``, ``remote``).
        capacity_blocks: ≥ 0; 0 holds nothing.
    """

    def __init__(self, name: str, capacity_blocks: int) -> None:
        if capacity_blocks < 0:
            raise ValueError(f"capacity_blocks = {capacity_blocks}, expected an integer ≥ 0")
        self.name = name
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()  # first = least recently used

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._blocks

    def __len__(self) -> int:
        return len(self._blocks)

    def put(self, block_hashes: Iterable[int]) -> list[int]:
        """Insert (or refresh) ``block_hashes`` in order; returns the hashes evicted to make room, LRU first."""
        if self.capacity_blocks == 0:
            return list(block_hashes)
        evicted: list[int] = []
        for block_hash in block_hashes:
            if block_hash in self._blocks:
                self._blocks.move_to_end(block_hash)
                continue
            self._blocks[block_hash] = None
            if len(self._blocks) > self.capacity_blocks:
                evicted.append(self._blocks.popitem(last=False)[0])
        return evicted

    def touch(self, block_hashes: Iterable[int]) -> None:
        """Mark held ``block_hashes`` as just used (missing ones are ignored)."""
        for block_hash in block_hashes:
            if block_hash in self._blocks:
                self._blocks.move_to_end(block_hash)

    def match_from(self, block_hashes: Sequence[int], start: int) -> int:
        """Leading blocks of ``block_hashes[start:]`` held here."""
        n = start
        while n < len(block_hashes) and block_hashes[n] in self._blocks:
            n += 1
        return n - start

    def order(self) -> list[int]:
        """Held hashes in eviction order (first = next to go)."""
        return list(self._blocks)

    def fork(self) -> TierCache:
        """An independent copy."""
        twin = TierCache(self.name, self.capacity_blocks)
        twin._blocks = OrderedDict(self._blocks)
        return twin


#: A directory event of one worker: ``(kind, tier, hashes)``, kind ``"stored"`` or ``"removed"``.
TierEvent = tuple[str, str, list[int]]


class WorkerTiers:
    """The lower tiers and links of one worker: CPU DRAM and disk caches, PCIe, NVMe and inbound network.

    Args:
        config: capacities and link specs.
        block_bytes: bytes of one KV block (``kv_bytes_per_token × block_size_tokens``), > 0.
    """

    def __init__(self, config: TierConfig, block_bytes: int) -> None:
        if block_bytes <= 0:
            raise ValueError(f"block_bytes = {block_bytes}, expected an integer > 0")
        self.block_bytes = block_bytes
        self.cpu = TierCache("cpu", config.capacity_blocks("cpu", block_bytes))
        self.disk = TierCache("disk", config.capacity_blocks("disk", block_bytes))
        self.pcie = Link(config.cpu_to_gpu)
        self.nvme = Link(config.disk_to_cpu)
        self.network = Link(config.network)

    def put_cpu(self, block_hashes: list[int]) -> list[TierEvent]:
        """Store blocks in CPU memory: GPU evictions (demotion) or fetched blocks (staging).

        CPU overflow is demoted to disk, disk overflow is dropped; a disabled CPU
        tier passes the blocks straight to disk.

        Returns:
            The directory events, in order.
        """
        events: list[TierEvent] = []
        moving = block_hashes
        for tier in (self.cpu, self.disk):
            if not moving:
                break
            if tier.capacity_blocks == 0:
                continue
            pushed_out = tier.put(moving)
            events.append(("stored", tier.name, list(moving)))
            if pushed_out:
                events.append(("removed", tier.name, pushed_out))
            moving = pushed_out
        return events

    def match_below(self, block_hashes: Sequence[int], start: int) -> tuple[int, int]:
        """``(cpu_blocks, disk_blocks)`` from ``start`` on: each block in CPU or else disk, up to the first miss."""
        cpu_blocks = disk_blocks = 0
        for block_hash in block_hashes[start:]:
            if block_hash in self.cpu:
                cpu_blocks += 1
            elif block_hash in self.disk:
                disk_blocks += 1
            else:
                break
        return cpu_blocks, disk_blocks

    def load(self, now_s: float, block_hashes: Sequence[int], cpu_blocks: int, disk_blocks: int) -> float:
        """Copy lower-tier blocks into GPU memory from ``now_s``: disk reads first, then one PCIe copy of all.

        Args:
            block_hashes: the blocks loaded (for LRU recency), ``cpu_blocks + disk_blocks`` of them.

        Returns:
            The time the last byte is in GPU memory (``now_s`` when nothing is loaded).
        """
        self.cpu.touch(block_hashes)
        self.disk.touch(block_hashes)
        _, disk_end_s = self.nvme.reserve(now_s, disk_blocks * self.block_bytes)
        _, end_s = self.pcie.reserve(disk_end_s, (cpu_blocks + disk_blocks) * self.block_bytes)
        return end_s

    def fork(self) -> WorkerTiers:
        """An independent copy (caches and link states)."""
        twin = copy.copy(self)
        twin.cpu, twin.disk = self.cpu.fork(), self.disk.fork()
        twin.pcie, twin.nvme, twin.network = copy.copy(self.pcie), copy.copy(self.nvme), copy.copy(self.network)
        return twin
