"""Per-worker GPU KV block pool with a prefix cache (the simulator's ground truth).

Mechanism follows vLLM v1 (``vllm/v1/core/block_pool.py`` and
``kv_cache_manager.py``):

* memory is a fixed number of blocks of ``block_size_tokens`` tokens;
* only *full* prompt blocks are hashed and cached; matching walks the
  request's chained block hashes from the start and stops at the first miss;
* a cached block has a reference count; only idle blocks (refcount 0) may be
  evicted; blocks of running requests never are. By default (``lru``) the
  least recently freed goes first; another registered eviction policy
  (:mod:`kvcost.eviction`) ranks idle leaves through an
  :class:`~kvcost.eviction.index.EvictionIndex`;
* when a request finishes its blocks are freed in *reverse* order, so the tail
  of a prefix is evicted before its head (vLLM frees ``reversed(blocks)``).

Blocks are allocated as vLLM v1 allocates them: the prompt's blocks at
admission (a request that does not fit waits, FCFS head-of-line), then one
block more whenever a decoding sequence fills its last one (:meth:`BlockPool.grow`).
Nothing reserves the output in advance, so a decoder can find the pool full; the
worker then preempts (:mod:`kvcost.replay.worker`), as vLLM does.

Events (stored / removed block hashes) are returned to the caller, which
delivers them to the cache directory, possibly late. With ``record_events``
the pool also keeps the block access history (:data:`BLOCK_EVENT_COLUMNS`),
the training data of the reuse classifier (:mod:`kvcost.models.reuse`).

Times are passed in (``now_s`` arguments, simulated seconds); no clock is read.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kvcost.eviction.base import EvictionPolicy
from kvcost.eviction.index import EvictionIndex
from kvcost.eviction.recency import LRUPolicy

#: Columns of one access-history row: time (s), block hash, event, depth (0-based, blocks), the
#: full prompt blocks of the request involved, and how many of its leading blocks that request found
#: cached at admission (0 for ``evicted``). Events: ``stored`` (computed and cached: a miss),
#: ``hit`` (reused at admission), ``idle`` (reference count reached 0), ``evicted``.
BLOCK_EVENT_COLUMNS: tuple[str, ...] = (
    "t_s",
    "block_hash",
    "event",
    "depth_blocks",
    "request_blocks",
    "reused_blocks",
)


@dataclass(slots=True)
class Allocation:
    """Blocks held by one admitted request.

    Attributes:
        cached_hashes: hashes of the prompt blocks the request holds a reference on,
            in prompt order (the reused prefix, then blocks registered as their chunks are scheduled).
        private_blocks: blocks not in the prefix cache (not-yet-registered prompt
            blocks, the partial last block, output tokens).
        reused_blocks: leading blocks found in the cache at admission.
    """

    cached_hashes: list[int] = field(default_factory=list)
    private_blocks: int = 0
    reused_blocks: int = 0


class BlockPool:
    """Fixed-capacity block pool with pluggable eviction of idle cached blocks.

    Args:
        capacity_blocks: total KV blocks on the GPU (≥ 1).
        cache_enabled: False disables prefix reuse entirely (``--cache off``):
            nothing is matched, nothing is retained after a request ends.
        eviction: None = ``lru`` (vLLM's order, least recently freed first, exactly);
            or an :class:`EvictionIndex` of this pool's capacity built for another policy.
        record_events: keep the access history in :attr:`block_events`.

    Thread safety: single-threaded (one simulated worker).
    """

    def __init__(
        self,
        capacity_blocks: int,
        cache_enabled: bool = True,
        eviction: EvictionIndex | None = None,
        record_events: bool = False,
    ) -> None:
        if capacity_blocks < 1:
            raise ValueError(f"capacity_blocks = {capacity_blocks}, expected an integer ≥ 1")
        self.capacity_blocks = capacity_blocks
        self.cache_enabled = cache_enabled
        self._refcount: dict[int, int] = {}
        self._idle: OrderedDict[int, None] = OrderedDict()  # LRU order: first is evicted first
        self._private_blocks = 0
        self._index = eviction
        self.block_events: list[tuple] | None = [] if record_events else None
        self._depth: dict[int, int] = {}  # depth of cached blocks, kept only while recording
        self._watched: Counter[int] = Counter()  # block hash → how many watchers (see watch)
        self.watched_idle_blocks = 0  # distinct watched hashes cached and idle now

    @property
    def eviction_policy(self) -> str:
        """Name of the eviction policy (without an index: ``lru``, which the pool runs natively)."""
        return LRUPolicy.name if self._index is None else self._index.policy.name

    @property
    def ranking_policy(self) -> EvictionPolicy | None:
        """The policy object the pool's eviction index ranks with (None for ``lru``, run natively)."""
        return None if self._index is None else self._index.policy

    # -- queries -----------------------------------------------------------------
    @property
    def used_blocks(self) -> int:
        """Blocks held by running requests (cached with refcount > 0, plus private)."""
        return len(self._refcount) - len(self._idle) + self._private_blocks

    @property
    def idle_blocks(self) -> int:
        """Cached blocks with refcount 0 (evictable)."""
        return len(self._idle)

    @property
    def free_blocks(self) -> int:
        """Blocks neither used nor cached."""
        return self.capacity_blocks - len(self._refcount) - self._private_blocks

    def usage(self) -> float:
        """Fraction of blocks used by running requests, in [0, 1] (vLLM's ``kv_cache_usage_perc``)."""
        return self.used_blocks / self.capacity_blocks

    def match_blocks(self, block_hashes: Sequence[int]) -> int:
        """Number of leading ``block_hashes`` present in the cache (active or idle)."""
        if not self.cache_enabled:
            return 0
        n = 0
        for block_hash in block_hashes:
            if block_hash not in self._refcount:
                break
            n += 1
        return n

    def watch(self, block_hashes: Iterable[int], delta: int) -> None:
        """Add (``delta`` = +1) or remove (−1) one watcher of each of ``block_hashes``.

        :attr:`watched_idle_blocks` is then, at every moment, how many distinct hashes with at least
        one watcher are cached and idle (reference count 0), kept as blocks become idle, are reused
        or are evicted. A worker watches the prefixes its not-yet-admitted requests expect to reuse:
        admitting a request that reuses an idle block takes it out of the evictable blocks, as
        allocating a new block does (:meth:`try_allocate`; vLLM's prefix-cache hit removes the block
        from its free queue), so these blocks are part of what the queue needs. The worker reads the
        count at each snapshot in O(1) instead of O(the queue's blocks) (``SimWorker._queue_changed``).

        Raises:
            ValueError: ``delta`` is not ±1, or a hash loses a watcher it does not have.
        """
        if delta not in (1, -1):
            raise ValueError(f"delta = {delta}, expected +1 or -1")
        watched, idle = self._watched, self._idle
        for block_hash in block_hashes:
            count = watched[block_hash] + delta
            if count < 0:
                raise ValueError(f"block hash {block_hash} is not watched, expected a watched hash to unwatch")
            if count == 0:
                del watched[block_hash]
            else:
                watched[block_hash] = count
            first_or_last = count == 1 if delta > 0 else count == 0
            if first_or_last and block_hash in idle:
                self.watched_idle_blocks += delta

    def eviction_order(self, now_s: float | None = None) -> list[int]:
        """Idle block hashes in the order they would be evicted (first = next).

        ``now_s`` re-scores time-varying policies at that time (see ``EvictionIndex.eviction_order``).
        """
        return list(self._idle) if self._index is None else self._index.eviction_order(now_s)

    def fork(self) -> BlockPool:
        """An independent copy (for what-if simulation: the oracle)."""
        twin = BlockPool.__new__(BlockPool)
        twin.capacity_blocks = self.capacity_blocks
        twin.cache_enabled = self.cache_enabled
        twin._refcount = dict(self._refcount)
        twin._idle = OrderedDict(self._idle)
        twin._private_blocks = self._private_blocks
        twin._index = self._index.fork() if self._index is not None else None
        twin.block_events = None
        twin._depth = dict(self._depth)
        twin._watched = Counter(self._watched)
        twin.watched_idle_blocks = self.watched_idle_blocks
        return twin

    # -- mechanism ---------------------------------------------------------------
    def try_allocate(
        self, full_block_hashes: Sequence[int], total_blocks: int, now_s: float = 0.0
    ) -> tuple[Allocation | None, list[int]]:
        """Admit a request: reuse its cached prefix and reserve the rest.

        Args:
            full_block_hashes: hashes of the prompt's full blocks, in order.
            total_blocks: blocks the sequence needs now (its prompt, and the output it will
                recompute after a preemption), ≥ len(full_block_hashes).
            now_s: admission time (simulated seconds), for the eviction policy and the history.

        Returns:
            ``(allocation, evicted_hashes)``; ``allocation`` is None (and nothing
            changes) when even evicting every idle block would not make room.
        """
        reused = self.match_blocks(full_block_hashes)
        reused_hashes = full_block_hashes[:reused]
        reused_idle = sum(1 for h in reused_hashes if h in self._idle)
        needed = total_blocks - reused
        if self.free_blocks + len(self._idle) - reused_idle < needed:
            return None, []
        for block_hash in reused_hashes:
            self._ref(block_hash, now_s, hit=True)
        self._record_chain(now_s, reused_hashes, "hit", len(full_block_hashes), reused)
        evicted = self._evict(needed - self.free_blocks, now_s)
        self._private_blocks += needed
        return Allocation(list(reused_hashes), needed, reused), evicted

    def grow(self, allocation: Allocation, n_blocks: int, now_s: float = 0.0) -> list[int] | None:
        """Give a running request ``n_blocks`` more private blocks (a decoding sequence filled its last block).

        Evicts idle cached blocks when no block is free, as vLLM's ``allocate_slots`` does.

        Returns:
            The evicted hashes, or None (and nothing changes) when even evicting every
            idle block would not make room: the caller must free blocks first (preemption).
        """
        if self.free_blocks + len(self._idle) < n_blocks:
            return None
        evicted = self._evict(n_blocks - self.free_blocks, now_s)
        self._private_blocks += n_blocks
        allocation.private_blocks += n_blocks
        return evicted

    def register_prefill(
        self,
        allocation: Allocation,
        full_block_hashes: Sequence[int],
        now_s: float = 0.0,
        request_blocks: int | None = None,
    ) -> list[int]:
        """Move the request's full prompt blocks in ``full_block_hashes`` that it has not registered yet into the
        prefix cache, at ``now_s``.

        vLLM caches a block when the step that computes it is scheduled, chunk by chunk
        (``KVCacheManager.allocate_slots`` → ``cache_blocks`` up to the computed plus the newly
        scheduled tokens, vLLM v0.32 ``vllm/v1/core/kv_cache_manager.py``), not when the whole
        prefill ends; so the worker calls this with each chunk's blocks, and a later request
        finds the blocks of a prefill still under way. A hash that another request registered
        meanwhile is shared (this request's private copy is released), as vLLM does for duplicate
        blocks.

        Args:
            full_block_hashes: the request's full prompt blocks computed so far (or all of them), in order.
            request_blocks: the request's full prompt blocks in all, for the history
                (default: ``len(full_block_hashes)``).

        Returns:
            Hashes newly stored in the cache (for a ``BlockStored`` event), in order.
        """
        if not self.cache_enabled:
            return []
        stored: list[int] = []
        start = len(allocation.cached_hashes)
        total = len(full_block_hashes) if request_blocks is None else request_blocks
        for depth, block_hash in enumerate(full_block_hashes[start:], start):
            if block_hash in self._refcount:
                self._ref(block_hash, now_s, hit=False)
            else:
                self._refcount[block_hash] = 1
                stored.append(block_hash)
                parent = full_block_hashes[depth - 1] if depth else None
                if self._index is not None:
                    self._index.on_stored(block_hash, parent, depth, now_s)
                self._record(now_s, block_hash, "stored", depth, total, allocation.reused_blocks)
            allocation.cached_hashes.append(block_hash)
            allocation.private_blocks -= 1
            self._private_blocks -= 1
        return stored

    def free(self, allocation: Allocation, now_s: float = 0.0) -> None:
        """Release a finished request at ``now_s``: private blocks are freed, cached ones become idle tail-first."""
        self._private_blocks -= allocation.private_blocks
        allocation.private_blocks = 0
        idle: list[int] = []
        for block_hash in reversed(allocation.cached_hashes):
            count = self._refcount[block_hash] - 1
            self._refcount[block_hash] = count
            if count == 0:
                self._idle[block_hash] = None
                idle.append(block_hash)
                if block_hash in self._watched:
                    self.watched_idle_blocks += 1
        request_blocks, reused = len(allocation.cached_hashes), allocation.reused_blocks
        if self._index is not None:
            self._index.on_idle(idle, request_blocks, now_s, reused)
        if self.block_events is not None:
            for block_hash in idle:
                self._record(now_s, block_hash, "idle", self._depth[block_hash], request_blocks, reused)
        allocation.cached_hashes = []

    def _ref(self, block_hash: int, now_s: float, hit: bool) -> None:
        count = self._refcount[block_hash]
        if count == 0:
            del self._idle[block_hash]
            if block_hash in self._watched:
                self.watched_idle_blocks -= 1
        self._refcount[block_hash] = count + 1
        if self._index is not None:
            self._index.on_hit(block_hash, now_s, count_hit=hit)

    def _evict(self, n_blocks: int, now_s: float) -> list[int]:
        evicted: list[int] = []
        for _ in range(max(0, n_blocks)):
            if self._index is None:
                block_hash, _ = self._idle.popitem(last=False)
            else:
                block_hash = self._index.pop(now_s)
                del self._idle[block_hash]
            del self._refcount[block_hash]
            if block_hash in self._watched:
                self.watched_idle_blocks -= 1
            evicted.append(block_hash)
            if self.block_events is not None:
                self._record(now_s, block_hash, "evicted", self._depth.pop(block_hash), 0, 0)
        return evicted

    # -- access history --------------------------------------------------------------
    def _record(
        self, now_s: float, block_hash: int, event: str, depth: int, request_blocks: int, reused_blocks: int
    ) -> None:
        if self.block_events is not None:
            self.block_events.append((now_s, block_hash, event, depth, request_blocks, reused_blocks))
            if event == "stored":
                self._depth[block_hash] = depth

    def _record_chain(
        self, now_s: float, hashes: Sequence[int], event: str, request_blocks: int, reused_blocks: int
    ) -> None:
        if self.block_events is not None:
            for depth, block_hash in enumerate(hashes):
                self._record(now_s, block_hash, event, depth, request_blocks, reused_blocks)
