"""The cache directory: which worker holds which prefix, in which tier, how fresh (docs/architecture.md §2).

Reuse is exact: an entry is reusable only inside one :class:`Namespace`
(model, revision, adapter, block size, KV layout, cache salt) and only for the
exact chain of block hashes. Because block hashes are chained (h_i depends on
h_{i-1} and the tokens of block i, as in vLLM's prefix caching), a block hash
identifies its whole prefix. The radix tree over block sequences is therefore
stored as a flat table ``hash -> holders`` per namespace; walking a request's
hashes in order is a walk from the root down the tree, and the first missing
hash ends the match.

Storage (per indexed block, measured by ``tests/routing/test_directory_bench.py``):
the holders of a block are a set of ``(worker, tiers)``. The common case, one
worker holding the block, is packed into a single int
``worker_id << 5 | tier_mask`` (bit ``k`` of the mask set ⇔ the worker holds the
block in the tier whose ``TIER_CODES`` code is ``k``); a block held by several
workers keeps a ``dict[worker_id, tier_mask]``. A worker can hold one block in
several tiers (vLLM's GPU prefix cache and its CPU offload each publish their own
events); a match reports the fastest tier held (lowest code).

Lookup speed: at 10^6 blocks each dictionary read is a cache miss, so a match must
not read every block of a long request. A chain of blocks one worker stored in one
tier (one BlockStored event, extended by the events whose ``parent_block_hash`` is
the chain's last block: the next prefill chunks, the blocks decode fills) shares one
packed holder object, a :class:`_Run`, that also keeps the chain's hashes; a match
that reaches such a block compares the request's next hashes with the run's in one
C-level slice comparison and skips the whole run. A run only vouches for its leading
blocks that no later event changed (``intact``); past them the match reads block by
block, which is also the worst case (events that name no parent).

The directory is fed by events (a worker stored / removed blocks, or cleared
everything); it knows only what the events told it, so it can lag the workers.
A match is a hint, never a promise: the worker re-checks at admission. A worker
whose event stream lost messages is marked *stale* (:meth:`CacheDirectory.mark_stale`)
until its entries are cleared; matches report the flag.

Approximate mode (workers that publish no events, as SGLang's router and AIBrix
do it): :meth:`CacheDirectory.record_routed` records the blocks routed to a
worker as held in ``"gpu"``, and :meth:`CacheDirectory.expire_routed` forgets
them after a TTL.

Size: each worker may hold at most ``max_blocks_per_worker`` blocks (every tier and
namespace; approximate-mode records included). Past it, the blocks it has held
longest are dropped (as if removed; vLLM's own eviction is LRU, so the oldest stored
are the likeliest to be gone already) and counted in :attr:`CacheDirectory.capped_blocks`.

Thread safety: not thread-safe; one owner applies events and queries, or every
caller holds one shared lock (``KVEventSubscriber.lock``). Time is always passed
in (``now_s``); nothing reads a clock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from kvcost.core.types import DirectoryMatch, Namespace
from kvcost.routing.holders import (
    _BEST_TIER,
    _MASK,
    _NEVER,
    _TIER_BIT,
    _TIER_BITS,
    _clear_mask,
    _detach,
    _drop,
    _Holders,
    _mask_of,
    _packable,
    _Run,
    _run_blocks,
    _StoreOrder,
    _tiers_of_mask,
)

#: Default cap on the blocks one worker may hold in the directory (every tier and namespace), 2^20. An engine
#: holds far fewer: 141 GB of HBM at 32 KiB of KV per token (a 1B-class model, bf16) and 16-token blocks is
#: 270k blocks, and a 1 TB CPU tier of an 8B model (2 MiB blocks) 500k. At about 100 bytes per block
#: (88 in the index, measured by tests/routing/test_directory_bench.py, plus the cap's order) this is
#: ~100 MB per worker at most. It bounds memory against a flood or lost removal events, not routing.
DEFAULT_MAX_BLOCKS_PER_WORKER = 1 << 20


class CacheDirectory:
    """Radix index over chained block hashes, per namespace, with tiers and freshness.

    Example:
        >>> ns = Namespace("llama-3-8b")
        >>> d = CacheDirectory()
        >>> d.apply_stored(ns, worker_id=0, block_hashes=[11, 12], parent_hash=None, tier="gpu", now_s=1.0)
        >>> d.match(ns, [11, 12, 13], worker_ids=[0, 1], now_s=3.0)[0].reusable_blocks
        2
    """

    def __init__(self, max_blocks_per_worker: int = DEFAULT_MAX_BLOCKS_PER_WORKER) -> None:
        if not (type(max_blocks_per_worker) is int and max_blocks_per_worker >= 1):
            raise ValueError(f"max_blocks_per_worker = {max_blocks_per_worker!r}, expected an integer ≥ 1")
        self.max_blocks_per_worker = max_blocks_per_worker
        #: Blocks dropped per worker because it passed ``max_blocks_per_worker`` (oldest stored first).
        self.capped_blocks: dict[int, int] = {}
        self._order: dict[int, _StoreOrder] = {}  # per worker: the blocks it holds, oldest first
        self._trees: dict[Namespace, dict[int, _Holders]] = {}
        self._last_event_s: dict[int, float] = {}
        self._namespaces_of: dict[int, set[Namespace]] = {}  # namespaces a worker ever stored into
        self._stale: set[int] = set()
        self._unknown: set[int] = set()  # workers whose engine cannot be reached: nothing of theirs is matched
        self._clears: dict[int, int] = {}  # full clears (engine restarts) per worker
        # approximate mode: (namespace, worker) -> block hash -> last time routed, oldest first
        self._routed: dict[tuple[Namespace, int], OrderedDict[int, float]] = {}

    # -- events ---------------------------------------------------------------------------------

    def apply_stored(
        self,
        namespace: Namespace,
        worker_id: int,
        block_hashes: Sequence[int],
        parent_hash: int | None,
        tier: str,
        now_s: float,
    ) -> None:
        """Record that ``worker_id`` now holds the chain ``block_hashes`` (child of ``parent_hash``) in ``tier``.

        Matching does not need ``parent_hash`` (a chained hash already identifies its
        prefix); it lets the directory see that the blocks continue a chain the worker
        stored before, so lookups can skip along the whole chain at once. Storing a
        block the worker already holds in another tier adds the tier.

        Raises:
            ValueError: unknown tier name.
        """
        bit = _TIER_BIT.get(tier)
        if bit is None:
            raise ValueError(f"tier = {tier!r}, expected one of gpu, cpu, disk, remote")
        tree = self._trees.get(namespace)
        if tree is None:
            tree = self._trees[namespace] = {}
        namespaces = self._namespaces_of.get(worker_id)
        if namespaces is None:
            namespaces = self._namespaces_of[worker_id] = set()
        namespaces.add(namespace)
        get = tree.get
        new: list[int] = []  # blocks the worker did not hold in any tier
        if _packable(worker_id):
            packed = (worker_id << _TIER_BITS) | bit
            run = get(parent_hash) if parent_hash is not None else None
            if type(run) is int and run == packed:  # the worker's chain continues: make its tail a run
                run = tree[parent_hash] = _Run(packed)
                run.hashes = [parent_hash]
                run.intact = 1
            extend = (
                type(run) is _Run
                and run == packed
                and run.intact == len(run.hashes) > 0
                and run.hashes[-1] == parent_hash
            )
            if not extend:
                run = _Run(packed) if len(block_hashes) >= 2 else packed
            created = 0
            for block_hash in block_hashes:
                holders = get(block_hash)
                if holders is None:
                    tree[block_hash] = run
                    created += 1
                    new.append(block_hash)
                elif type(holders) is dict:
                    mask = holders.get(worker_id, 0)
                    holders[worker_id] = mask | bit
                    if not mask:
                        new.append(block_hash)
                elif holders >> _TIER_BITS == worker_id:
                    if not holders & bit:
                        if type(holders) is _Run:
                            _detach(holders, block_hash)
                        tree[block_hash] = int(holders) | bit
                else:
                    if type(holders) is _Run:
                        _detach(holders, block_hash)
                    tree[block_hash] = {holders >> _TIER_BITS: holders & _MASK, worker_id: bit}
                    new.append(block_hash)
            if type(run) is _Run:
                if created == len(block_hashes):  # a chain of new blocks: the run can vouch for it
                    if extend:
                        run.hashes.extend(block_hashes)
                    else:
                        run.hashes = list(block_hashes)
                    run.intact = len(run.hashes)
                elif not extend:
                    run.hashes = []
                    run.intact = 0
        else:
            for block_hash in block_hashes:
                holders = get(block_hash)
                if holders is None:
                    tree[block_hash] = {worker_id: bit}
                    new.append(block_hash)
                elif type(holders) is dict:
                    mask = holders.get(worker_id, 0)
                    holders[worker_id] = mask | bit
                    if not mask:
                        new.append(block_hash)
                else:
                    if type(holders) is _Run:
                        _detach(holders, block_hash)
                    tree[block_hash] = {holders >> _TIER_BITS: holders & _MASK, worker_id: bit}
                    new.append(block_hash)
        self._last_event_s[worker_id] = now_s
        if new:
            self._held(worker_id, namespace, new)

    def apply_removed(
        self,
        namespace: Namespace,
        worker_id: int,
        block_hashes: Iterable[int],
        now_s: float,
        tier: str | None = None,
    ) -> None:
        """Record that ``worker_id`` dropped ``block_hashes``; nodes with no holder left are deleted.

        Args:
            tier: drop only this tier (the worker may still hold the block in another);
                ``None`` drops every tier.

        Raises:
            ValueError: unknown tier name.
        """
        clear_mask = _clear_mask(tier)
        tree = self._trees.get(namespace)
        if tree is not None:
            self._released(worker_id, _drop(tree, worker_id, block_hashes, clear_mask))
        self._last_event_s[worker_id] = now_s

    def apply_removed_everywhere(
        self, worker_id: int, block_hashes: Iterable[int], now_s: float, tier: str | None = None
    ) -> None:
        """Drop ``block_hashes`` of ``worker_id`` in every namespace it has stored into.

        vLLM's BlockRemoved event names neither adapter nor salt, so the caller cannot
        tell the namespace; the hashes themselves are namespace-specific.

        Args:
            tier: drop only this tier (the worker may still hold the block in another);
                ``None`` drops every tier.

        Raises:
            ValueError: unknown tier name.
        """
        clear_mask = _clear_mask(tier)
        namespaces = self._namespaces_of.get(worker_id, ())
        if len(namespaces) == 1:
            (namespace,) = namespaces
            self._released(worker_id, _drop(self._trees[namespace], worker_id, block_hashes, clear_mask))
        elif namespaces:
            hashes = list(block_hashes)
            for namespace in namespaces:
                self._released(worker_id, _drop(self._trees[namespace], worker_id, hashes, clear_mask))
        self._last_event_s[worker_id] = now_s

    def clear_worker(self, worker_id: int, now_s: float, tier: str | None = None) -> None:
        """Drop the entries of ``worker_id`` in every namespace: an engine restart (every tier) or
        vLLM's AllBlocksCleared (``tier="gpu"``: ``reset_prefix_cache`` empties the GPU block pool,
        not the offload connector's CPU / disk copies).

        Once the worker holds nothing in any tier it is no longer stale nor unknown (the
        directory's view of it is exact: empty); a full clear also forgets its
        approximate-mode records.

        Raises:
            ValueError: unknown tier name.
        """
        clear_mask = _clear_mask(tier)
        held_elsewhere = False
        for namespace in list(self._namespaces_of.get(worker_id, ())):
            tree = self._trees[namespace]
            mine = [h for h, v in tree.items() if (worker_id in v if type(v) is dict else v >> _TIER_BITS == worker_id)]
            self._released(worker_id, _drop(tree, worker_id, mine, clear_mask))
            if tier is not None and not held_elsewhere:
                held_elsewhere = any(h in tree and _mask_of(tree[h], worker_id) for h in mine)
        if not held_elsewhere:
            self._namespaces_of.pop(worker_id, None)
            self._stale.discard(worker_id)
            self._unknown.discard(worker_id)
        if tier is None:
            for key in [key for key in self._routed if key[1] == worker_id]:
                del self._routed[key]
            self._order.pop(worker_id, None)
            self._clears[worker_id] = self._clears.get(worker_id, 0) + 1
        self._last_event_s[worker_id] = now_s

    def blocks_held(self, worker_id: int) -> int:
        """Blocks ``worker_id`` holds in any tier, all namespaces (≤ ``max_blocks_per_worker``)."""
        order = self._order.get(worker_id)
        return order.held if order is not None else 0

    def _held(self, worker_id: int, namespace: Namespace, new_hashes: list[int]) -> None:
        """``worker_id`` came to hold ``new_hashes``; past the cap its oldest blocks are dropped."""
        order = self._order.get(worker_id)
        if order is None:
            order = self._order[worker_id] = _StoreOrder()
        order.add(namespace, new_hashes)
        if order.held > self.max_blocks_per_worker:
            self._drop_oldest(worker_id, order)
        if order.entries > 2 * order.held + 1024:
            order.compact(self._trees, worker_id)

    def _drop_oldest(self, worker_id: int, order: _StoreOrder) -> None:
        dropped = 0
        while order.held > self.max_blocks_per_worker and (oldest := order.pop_oldest()) is not None:
            namespace, block_hash = oldest
            if _drop(self._trees[namespace], worker_id, (block_hash,), _MASK):
                order.held -= 1
                dropped += 1
                routed = self._routed.get((namespace, worker_id))
                if routed is not None:
                    routed.pop(block_hash, None)
        self.capped_blocks[worker_id] = self.capped_blocks.get(worker_id, 0) + dropped

    def _released(self, worker_id: int, blocks: int) -> None:
        if blocks:
            self._order[worker_id].held -= blocks

    def clears(self, worker_id: int) -> int:
        """How many full :meth:`clear_worker` calls (every tier: an engine restart) ``worker_id`` has had, ≥ 0.

        A router compares it with the count it last saw to forget what it sent to the old process.
        """
        return self._clears.get(worker_id, 0)

    def touch(self, worker_id: int, now_s: float) -> None:
        """Record that the directory heard from ``worker_id`` at ``now_s`` (restarts its entries' age)."""
        self._last_event_s[worker_id] = now_s

    def mark_stale(self, worker_id: int) -> None:
        """Flag ``worker_id``'s entries as possibly wrong (its event stream lost messages).

        The flag is reported in :attr:`DirectoryMatch.stale` and cleared by
        :meth:`clear_worker` (an engine restart or AllBlocksCleared makes the view exact again).
        """
        self._stale.add(worker_id)

    def is_stale(self, worker_id: int) -> bool:
        """Whether :meth:`mark_stale` flagged ``worker_id`` since its last :meth:`clear_worker`."""
        return worker_id in self._stale

    def mark_unknown(self, worker_id: int) -> None:
        """Match nothing on ``worker_id`` until :meth:`mark_known`: its engine cannot be reached.

        A down engine holds no cache anyone can use, and one that comes back may be a new
        process with an empty cache whose first KV event has not arrived yet. Its entries are
        kept (the engine may come back as the same process, cache intact), but
        :meth:`match` reports 0 reusable blocks and ``stale`` for it.
        """
        self._unknown.add(worker_id)

    def mark_known(self, worker_id: int) -> None:
        """Match ``worker_id``'s entries again (its engine answers as the same process); see :meth:`mark_unknown`."""
        self._unknown.discard(worker_id)

    def is_unknown(self, worker_id: int) -> bool:
        """Whether ``worker_id`` is marked unknown (:meth:`mark_unknown`)."""
        return worker_id in self._unknown

    # -- approximate mode -----------------------------------------------------------------------

    def record_routed(self, namespace: Namespace, worker_id: int, block_hashes: Sequence[int], now_s: float) -> None:
        """Approximate mode: assume ``worker_id`` holds ``block_hashes`` in ``"gpu"`` because they were routed there.

        For workers that publish no KV events. Each block's routing time is kept so
        :meth:`expire_routed` can forget it; routing a block again renews it. Counts as
        hearing from the worker (its entries' age restarts at ``now_s``).
        """
        self.apply_stored(namespace, worker_id, block_hashes, None, "gpu", now_s)
        key = (namespace, worker_id)
        routed = self._routed.get(key)
        if routed is None:
            routed = self._routed[key] = OrderedDict()
        for block_hash in block_hashes:
            routed[block_hash] = now_s
            routed.move_to_end(block_hash)

    def expire_routed(self, now_s: float, ttl_s: float) -> int:
        """Forget approximate-mode blocks last routed more than ``ttl_s`` before ``now_s``.

        A block routed at ``t`` is dropped (its ``"gpu"`` tier, for that worker) when
        ``t < now_s − ttl_s``. Assumes the ``now_s`` passed to :meth:`record_routed`
        never decreases (records are kept oldest first).

        Returns:
            Blocks dropped.
        """
        cutoff_s = now_s - ttl_s
        dropped = 0
        for key in list(self._routed):
            routed = self._routed[key]
            expired = []
            while routed:
                block_hash, routed_s = next(iter(routed.items()))
                if routed_s >= cutoff_s:
                    break
                routed.popitem(last=False)
                expired.append(block_hash)
            if expired:
                namespace, worker_id = key
                self._released(worker_id, _drop(self._trees[namespace], worker_id, expired, _TIER_BIT["gpu"]))
                dropped += len(expired)
            if not routed:
                del self._routed[key]
        return dropped

    # -- queries --------------------------------------------------------------------------------

    def match(
        self, namespace: Namespace, block_hashes: Sequence[int], worker_ids: Sequence[int], now_s: float
    ) -> list[DirectoryMatch]:
        """Longest prefix of ``block_hashes`` held by each of ``worker_ids``.

        Args:
            block_hashes: the request's full-block hashes, in prompt order.
            worker_ids: candidates; the result has one entry per candidate, same order.
            now_s: current time, for the entry age.

        Returns:
            ``list[DirectoryMatch]`` of length ``len(worker_ids)``.
        """
        tree = self._trees.get(namespace)
        depth: dict[int, int] = {}  # worker -> matched blocks, for workers with at least one
        if tree and worker_ids:
            request = block_hashes if type(block_hashes) is list else list(block_hashes)
            n = len(request)
            get = tree.get
            alive = set(worker_ids)  # workers holding every block walked so far
            i = 0
            while i < n:
                holders = get(request[i])
                if holders is None:
                    break
                if type(holders) is dict:
                    if not alive <= holders.keys():
                        dropped = alive - holders.keys()
                        depth.update(dict.fromkeys(dropped, i))
                        alive -= dropped
                        if not alive:
                            break
                    i += 1
                    continue
                holder = holders >> _TIER_BITS
                if holder not in alive:
                    break
                if len(alive) > 1:
                    alive.discard(holder)
                    depth.update(dict.fromkeys(alive, i))
                    alive = {holder}
                i += _run_blocks(holders, request, i) if type(holders) is _Run else 1
            depth.update(dict.fromkeys(alive, i))
        last = self._last_event_s
        stale = self._stale
        unknown = self._unknown
        result = []
        for worker_id in worker_ids:
            blocks = 0 if worker_id in unknown else depth.get(worker_id, 0)
            tier = "none"
            if blocks:
                holders = tree[block_hashes[blocks - 1]]
                tier = _BEST_TIER[holders[worker_id] if type(holders) is dict else holders & _MASK]
            is_stale = worker_id in stale or worker_id in unknown
            result.append(DirectoryMatch(worker_id, blocks, tier, now_s - last.get(worker_id, _NEVER), is_stale))
        return result

    def match_tiers(
        self, namespace: Namespace, block_hashes: Sequence[int], worker_ids: Sequence[int]
    ) -> dict[int, tuple[int, int, int]]:
        """Leading blocks of ``block_hashes`` each worker holds, by how deep a tier it may read them from.

        For a tiered worker (GPU backed by CPU DRAM and disk), block ``k`` can be
        reused if it sits in any of the worker's tiers; what it costs depends on
        which. Walks block by block (no run skipping), so it costs one dictionary
        read per block; use :meth:`match` when tiers do not matter.

        Args:
            block_hashes: the request's full-block hashes, in prompt order.
            worker_ids: workers (or the remote store's id) to report.

        Returns:
            ``{worker_id: (gpu_blocks, cpu_blocks, any_blocks)}``: leading blocks held
            in the GPU tier; in the GPU or CPU tier; in any tier. Non-decreasing;
            ``(0, 0, 0)`` for a worker holding nothing or marked unknown.
        """
        tree = self._trees.get(namespace, {})
        limits = (_TIER_BIT["gpu"], _TIER_BIT["gpu"] | _TIER_BIT["cpu"], _MASK)
        depth = {worker_id: [0, 0, 0] for worker_id in worker_ids}
        open_levels = {worker_id: [0, 1, 2] for worker_id in worker_ids if worker_id not in self._unknown}
        for i, block_hash in enumerate(block_hashes):
            holders = tree.get(block_hash)
            if holders is None or not open_levels:
                break
            for worker_id in list(open_levels):
                mask = _mask_of(holders, worker_id)
                levels = [level for level in open_levels[worker_id] if mask & limits[level]]
                for level in levels:
                    depth[worker_id][level] = i + 1
                if levels:
                    open_levels[worker_id] = levels
                else:
                    del open_levels[worker_id]
        return {worker_id: tuple(d) for worker_id, d in depth.items()}

    def holders(self, namespace: Namespace, block_hash: int) -> dict[int, tuple[str, ...]]:
        """Workers holding ``block_hash`` in ``namespace``, each with its tiers (fastest first)."""
        holders = self._trees.get(namespace, {}).get(block_hash)
        if holders is None:
            return {}
        if type(holders) is dict:
            return {worker_id: _tiers_of_mask(mask) for worker_id, mask in holders.items()}
        return {holders >> _TIER_BITS: _tiers_of_mask(holders & _MASK)}

    def num_blocks(self, namespace: Namespace | None = None) -> int:
        """Distinct block hashes known (in one namespace, or all)."""
        if namespace is not None:
            return len(self._trees.get(namespace, {}))
        return sum(len(tree) for tree in self._trees.values())
