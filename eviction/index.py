"""The incremental eviction index a simulated block pool uses (a lazy min-heap of idle leaves).

Per cached block (a *slot*, at most the pool's capacity) it keeps the
statistics of :class:`~kvcost.eviction.base.NodeTable` in NumPy
arrays, the block's current value and whether it is a candidate (idle, and
for leaf-only policies a leaf). The heap holds ``(value,
last_access_s, -depth, seq, slot)`` entries; an entry whose ``seq`` is no longer the
slot's is stale and skipped when popped (lazy deletion).

Scoring is batched, never per block:

* blocks freed by one request are scored in one ``policy.terms`` call
  (:meth:`EvictionIndex.on_idle`), idle parents included, so that a parent
  exposed later by an eviction already has a value;
* time-varying policies (``lhd``, ``flop_aware``, ``cost_aware``) re-score
  every candidate in one call and rebuild the heap when ``rerank_interval_s``
  of simulated time has passed since the last re-rank (checked on
  :meth:`pop`).

Thread safety: single-threaded (one simulated worker).
"""

from __future__ import annotations

import copy
import heapq
from collections.abc import Hashable, Sequence

import numpy as np

from kvcost.eviction.base import EVICTION_POLICIES, EvictionPolicy, NodeTable, make_eviction_policy, subtree_max
from kvcost.eviction.prefill import BlockCostTable


class EvictionIndex:
    """Idle blocks of one pool ordered by ``policy`` (lowest value evicted first).

    Args:
        policy: a fresh policy instance (not shared with another pool).
        costs: the block cost tables of the pool's GPU type.
        capacity_blocks: the pool's capacity (slots), ≥ 1.
        rerank_interval_s: re-rank period of time-varying policies, simulated seconds (> 0).

    Raises:
        ValueError: ``capacity_blocks`` < 1 or ``rerank_interval_s`` ≤ 0.
    """

    def __init__(
        self, policy: EvictionPolicy, costs: BlockCostTable, capacity_blocks: int, rerank_interval_s: float
    ) -> None:
        if capacity_blocks < 1:
            raise ValueError(f"capacity_blocks = {capacity_blocks}, expected an integer ≥ 1")
        if not rerank_interval_s > 0:
            raise ValueError(f"rerank_interval_s = {rerank_interval_s!r}, expected a number > 0")
        self.policy = policy
        self.costs = costs
        self.rerank_interval_s = rerank_interval_s
        n = capacity_blocks
        self.depth = np.zeros(n, dtype=np.int64)
        self.hits = np.zeros(n, dtype=np.int64)
        self.last_access_s = np.zeros(n)
        self.created_s = np.zeros(n)
        self.request_blocks = np.ones(n, dtype=np.int64)
        self.request_reused = np.zeros(n, dtype=np.int64)
        self.parent = np.full(n, -1, dtype=np.int64)
        self.children = np.zeros(n, dtype=np.int64)
        self.idle = np.zeros(n, dtype=bool)
        self.value = np.zeros(n)
        self.seq = np.zeros(n, dtype=np.int64)
        self.block_hash = np.full(n, -1, dtype=np.int64)  # int hashes (the simulator's), for clairvoyant
        self._hash_of: list[Hashable | None] = [None] * n
        self._slot: dict[Hashable, int] = {}
        self._free_slots = list(range(n - 1, -1, -1))
        self._heap: list[tuple[float, int, float, int, int]] = []
        self._counter = 0
        self._last_rerank_s = -np.inf

    # -- block life ----------------------------------------------------------------
    def on_stored(self, block_hash: Hashable, parent_hash: Hashable | None, depth_blocks: int, now_s: float) -> None:
        """A block entered the cache (held by the request that computed it)."""
        slot = self._free_slots.pop()
        self._slot[block_hash] = slot
        self._hash_of[slot] = block_hash
        self.block_hash[slot] = block_hash if isinstance(block_hash, int) and 0 <= block_hash < 2**63 else -1
        parent = self._slot.get(parent_hash, -1) if parent_hash is not None else -1
        self.depth[slot], self.hits[slot], self.request_blocks[slot] = depth_blocks, 0, depth_blocks + 1
        self.request_reused[slot] = 0
        self.last_access_s[slot] = self.created_s[slot] = now_s
        self.parent[slot], self.children[slot], self.idle[slot] = parent, 0, False
        self._invalidate(slot)
        if parent >= 0:
            self.children[parent] += 1
            self._invalidate(parent)

    def on_hit(self, block_hash: Hashable, now_s: float, count_hit: bool = True) -> None:
        """A request referenced the block (it is active now); an idle block leaves the candidates.

        ``count_hit`` False: a duplicate registration (the request computed the block while
        another stored it), which is not a reuse.
        """
        slot = self._slot[block_hash]
        if self.idle[slot]:
            if count_hit:
                self.policy.on_hit(int(self.hits[slot]), now_s - float(self.last_access_s[slot]))
            self.idle[slot] = False
            self._invalidate(slot)
        self.hits[slot] += int(count_hit)
        self.last_access_s[slot] = now_s

    def on_idle(
        self, block_hashes: Sequence[Hashable], request_blocks: int, now_s: float, reused_blocks: int = 0
    ) -> None:
        """Blocks released by one request reached reference count 0: score them in one batch.

        ``request_blocks``: the request's full prompt blocks; ``reused_blocks``: how many leading
        ones it found cached at admission (``NodeTable.request_reused_blocks``).
        """
        if not block_hashes:
            return
        slots = np.fromiter((self._slot[h] for h in block_hashes), dtype=np.int64, count=len(block_hashes))
        self.idle[slots] = True
        self.last_access_s[slots] = now_s
        self.request_blocks[slots] = request_blocks
        self.request_reused[slots] = reused_blocks
        self.value[slots] = self.policy.score_new(self.table(slots), now_s)
        for slot in slots.tolist():
            if self._is_candidate(slot):
                self._push(slot)

    def pop(self, now_s: float) -> Hashable:
        """Evict the lowest-value candidate and return its hash.

        Raises:
            IndexError: no idle block.
        """
        if self.policy.time_varying and now_s - self._last_rerank_s >= self.rerank_interval_s:
            self.rerank(now_s)
        while True:
            value, _, _, seq, slot = heapq.heappop(self._heap)
            if self.seq[slot] == seq:
                break
        block_hash = self._hash_of[slot]
        self.policy.on_evict(value, int(self.hits[slot]), now_s - float(self.last_access_s[slot]))
        self._release(slot)
        del self._slot[block_hash]
        return block_hash

    def rerank(self, now_s: float) -> None:
        """Re-score every idle block in one call; rebuild the heap of the candidates (idle leaves,
        or every idle block for ``lru``-like policies).

        Idle inner blocks are re-scored too, so that a parent exposed by an eviction before the
        next re-rank is pushed with a value as fresh as its evicted child's. Were it pushed with
        the value it got when it turned idle (idle age 0, the highest P(reuse) it will have), a
        chain would lose one block and then be protected until the next re-rank while the tails of
        many other chains went instead — the deepest, most expensive block of each.
        """
        self._last_rerank_s = now_s
        idle = np.flatnonzero(self.idle)
        if len(idle):
            self.value[idle] = self.policy.terms(self.table(idle), now_s)["value"]
        self._heap = []
        for slot in idle.tolist():
            if self._is_candidate(slot):
                self._push(slot, heapify=False)
        heapq.heapify(self._heap)

    # -- views ---------------------------------------------------------------------
    def table(self, slots: np.ndarray, with_parents: bool = False) -> NodeTable:
        """The :class:`NodeTable` of ``slots``; ``with_parents`` fills ``parent`` with rows of the same table."""
        prefill_s, flops = self.costs.lookup(self.depth[slots])
        n = len(slots)
        parent = None
        if with_parents:
            row = np.full(len(self.depth), -1, dtype=np.int64)
            row[slots] = np.arange(n)
            own = self.parent[slots]
            parent = np.where(own >= 0, row[np.maximum(own, 0)], -1)
        return NodeTable(
            depth_blocks=self.depth[slots],
            hits=self.hits[slots],
            last_access_s=self.last_access_s[slots],
            created_s=self.created_s[slots],
            size_bytes=np.full(n, self.costs.size_bytes),
            prefill_saved_s=prefill_s,
            restore_s=np.full(n, self.costs.restore_s),
            flops_saved=flops,
            category=np.zeros(n, dtype=np.int64),
            request_blocks=self.request_blocks[slots],
            parent=parent if parent is not None else np.full(n, -1, dtype=np.int64),
            request_reused_blocks=self.request_reused[slots],
            block_hash=self.block_hash[slots],
        )

    def eviction_order(self, now_s: float | None = None) -> list[Hashable]:
        """Idle hashes in eviction order with the stored values, or (``now_s`` given, time-varying
        policies) with every idle block re-scored at ``now_s``; no time passes."""
        slots = np.flatnonzero(self.idle)
        table = self.table(slots, with_parents=True)
        fresh = now_s is not None and self.policy.time_varying and len(slots)
        key = self.policy.terms(table, now_s)["value"] if fresh else self.value[slots]
        if self.policy.leaves_only:
            key = subtree_max(key, table.parent, self.depth[slots])
        order = np.lexsort((self.seq[slots], -self.depth[slots], self.last_access_s[slots], key))
        return [self._hash_of[s] for s in slots[order].tolist()]

    def fork(self) -> EvictionIndex:
        """An independent copy (arrays, heap and the policy's state)."""
        twin = copy.copy(self)
        for name, value in vars(self).items():
            if isinstance(value, np.ndarray | list | dict):
                setattr(twin, name, copy.copy(value))
        twin.policy = copy.copy(self.policy)
        for name, value in vars(self.policy).items():
            if isinstance(value, np.ndarray):
                setattr(twin.policy, name, value.copy())
        return twin

    # -- internals -----------------------------------------------------------------
    def _is_candidate(self, slot: int) -> bool:
        return bool(self.idle[slot]) and (not self.policy.leaves_only or self.children[slot] == 0)

    def _push(self, slot: int, heapify: bool = True) -> None:
        self._counter += 1
        self.seq[slot] = self._counter
        entry = (float(self.value[slot]), float(self.last_access_s[slot]), -int(self.depth[slot]), self._counter, slot)
        if heapify:
            heapq.heappush(self._heap, entry)
        else:
            self._heap.append(entry)

    def _invalidate(self, slot: int) -> None:
        self._counter += 1
        self.seq[slot] = self._counter

    def _release(self, slot: int) -> None:
        parent = int(self.parent[slot])
        self.idle[slot] = False
        self._invalidate(slot)
        self._hash_of[slot] = None
        self._free_slots.append(slot)
        if parent >= 0:
            self.children[parent] -= 1
            if self._is_candidate(parent):
                self._push(parent)
        if not self.policy.leaves_only:
            orphans = np.flatnonzero(self.parent == slot)
            self.parent[orphans] = -1


def needs_index(policy_name: str) -> bool:
    """False for a policy a block pool runs itself (``pool_native``: ``lru``, vLLM's ordered free queue).

    Raises:
        KeyError: unknown policy name.
    """
    return not EVICTION_POLICIES.get(policy_name).pool_native


def make_eviction_index(policy_name: str, context, costs: BlockCostTable, capacity_blocks: int) -> EvictionIndex | None:
    """The index for ``policy_name`` (None for a ``pool_native`` policy, see :func:`needs_index`).

    Raises:
        KeyError: unknown policy name.
    """
    if not needs_index(policy_name):
        return None
    policy = make_eviction_policy(policy_name, context)
    return EvictionIndex(policy, costs, capacity_blocks, policy.context.rerank_interval_s)
