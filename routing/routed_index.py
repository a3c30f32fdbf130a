"""Approximate prefix index built from routing decisions, for routers without KV events.

SGLang's router (``sgl-router``'s approximate radix tree), AIBrix's prefix-cache
router and Preble's global radix tree do not see the engines' caches; they
remember which prompt prefixes they *sent* to each worker and assume those are
still cached, trimming the memory by LRU or age. This index does the same over
chained block hashes: per worker, an LRU-ordered set of block hashes with the
time each was last routed there. Because hashes are chained, walking a
request's hashes in order and stopping at the first one a worker lacks is a
radix-tree prefix match.

Thread safety: not thread-safe; one owner (a policy instance).
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field


class RoutedPrefixIndex:
    """Per-worker LRU sets of routed block hashes.

    Example:
        >>> index = RoutedPrefixIndex()
        >>> index.insert(0, [1, 2, 3], now_s=0.0)
        >>> index.match([1, 2, 9], [0, 1])
        [2, 0]
    """

    def __init__(self) -> None:
        self._lru: dict[int, OrderedDict[int, float]] = {}

    def insert(self, worker_id: int, block_hashes: Sequence[int], now_s: float) -> None:
        """Record that ``block_hashes`` (prompt order) were routed to ``worker_id`` at ``now_s``.

        The blocks are touched deepest first, so the prompt's root ends most
        recently used and LRU trimming removes the deepest blocks first, as
        radix-tree leaf eviction does; a trimmed chain keeps a matchable head.
        """
        lru = self._lru.setdefault(worker_id, OrderedDict())
        for block_hash in reversed(block_hashes):
            lru[block_hash] = now_s
            lru.move_to_end(block_hash)

    def match(self, block_hashes: Sequence[int], worker_ids: Sequence[int]) -> list[int]:
        """Leading blocks of ``block_hashes`` each worker is believed to hold, same order as ``worker_ids``."""
        result = []
        for worker_id in worker_ids:
            lru = self._lru.get(worker_id, {})
            n = 0
            while n < len(block_hashes) and block_hashes[n] in lru:
                n += 1
            result.append(n)
        return result

    def size_blocks(self, worker_id: int) -> int:
        """Blocks remembered for ``worker_id``."""
        return len(self._lru.get(worker_id, ()))

    def trim(self, max_blocks_per_worker: int, worker_id: int | None = None) -> int:
        """Drop least recently routed blocks until each worker (or just ``worker_id``) holds at most the limit.

        Returns:
            Blocks dropped.
        """
        dropped = 0
        lrus = self._lru.values() if worker_id is None else [self._lru.get(worker_id, OrderedDict())]
        for lru in lrus:
            while len(lru) > max_blocks_per_worker:
                lru.popitem(last=False)
                dropped += 1
        return dropped

    def expire(self, older_than_s: float) -> int:
        """Drop blocks last routed before ``older_than_s`` (a TTL). Returns blocks dropped."""
        dropped = 0
        for lru in self._lru.values():
            while lru and next(iter(lru.values())) < older_than_s:
                lru.popitem(last=False)
                dropped += 1
        return dropped


class InFlightPrefixes:
    """Prefixes of routed requests that have not produced their first token yet.

    kvcost issue 13 §3: a family's next turn, arriving while its previous turn is
    still queued on worker A, finds nothing in the directory (it lists stored
    blocks only), yet under FCFS with chunked prefill the earlier request stores
    its prompt's blocks on A before this request's first chunk runs. The router
    knows those prefixes from what it routed (never from the worker's true
    queue), as Dynamo's predicted-TTL side index does for sibling bursts.

    An entry is one routed chain of block hashes (prompt order) on one
    ``(namespace, worker)``, keyed by its last hash (chained hashes: the last hash
    names the chain), with the routed requests that carry it. Routing the same
    chain there again adds its request and extends the expiry. A request leaves
    with its outcome (:meth:`release`: its first token came, so it was admitted and
    stored its prompt's blocks, which it holds while it runs); the entry leaves with
    its last request, or when its expiry passes (:meth:`expire`: an outcome that
    never comes, a request lost). A store the directory reports is not a release:
    when two queued requests carry one chain, the first one's store says nothing of
    the second, which stores the chain again if it is evicted meanwhile (measured
    in ``make e2e``: requests that hit blocks the index had dropped on the first
    store). A block in the per-worker count is a prefix held by some entry, so
    :meth:`match` is a radix-tree prefix walk.

    Size: past ``max_blocks_per_worker`` distinct blocks on one ``(namespace, worker)``,
    the entries routed there longest ago are dropped (an entry lives seconds, so
    this binds only a flood of distinct prefixes).

    Cost: :meth:`add` O(chain), :meth:`match` O(matched blocks), :meth:`release`
    O(1) while the entry keeps other requests, else O(chain), :meth:`expire`
    O(log entries) per entry dropped (a heap with lazy deletion), so a route stays
    cheap however many entries are held.

    Thread safety: not thread-safe; one owner (a router).

    Example:
        >>> index = InFlightPrefixes()
        >>> index.add("ns", 0, [1, 2, 3], expires_s=5.0, request_id=7)
        >>> index.add("ns", 0, [1, 2, 3], expires_s=6.0, request_id=8)
        >>> index.match("ns", [1, 2, 9], [0, 1])
        [2, 0]
        >>> index.release(7), index.match("ns", [1, 2, 9], [0, 1])
        (True, [2, 0])
        >>> index.release(8), index.match("ns", [1, 2, 9], [0, 1])
        (True, [0, 0])
    """

    def __init__(self, max_blocks_per_worker: int = 1 << 20) -> None:
        if not (type(max_blocks_per_worker) is int and max_blocks_per_worker >= 1):
            raise ValueError(f"max_blocks_per_worker = {max_blocks_per_worker!r}, expected an integer ≥ 1")
        self.max_blocks_per_worker = max_blocks_per_worker
        #: Entries dropped because their ``(namespace, worker)`` passed ``max_blocks_per_worker`` blocks.
        self.capped_entries = 0
        # (namespace, worker) -> {last hash: entry}, oldest added first; block hash -> entries holding it
        self._entries: dict[tuple[object, int], dict[int, _InFlightEntry]] = {}
        self._counts: dict[tuple[object, int], dict[int, int]] = {}
        self._requests: dict[int, tuple[tuple[object, int], int]] = {}  # request id -> (key, last hash)
        self._expiry: list[tuple[float, int, tuple[object, int], int]] = []  # (expires_s, seq, key, last hash)
        self._first: dict[tuple[object, int], dict[int, float]] = {}  # block hash -> latest predicted first token
        self._seq = 0

    def add(
        self,
        namespace: object,
        worker_id: int,
        block_hashes: Sequence[int],
        expires_s: float,
        request_id: int | None = None,
        first_token_s: float | None = None,
    ) -> None:
        """Record that request ``request_id`` with ``block_hashes`` was routed to ``worker_id``; forget it at
        ``expires_s`` (or later, if the same chain was routed there before with a later expiry). A request id
        already held is released first (ids are unique per router; a reused one names the newer request);
        ``request_id`` None: no outcome will come, the entry leaves by its expiry only. ``first_token_s``: when
        the request's first token is predicted (the caller's clock), kept per block as the latest of the
        requests holding it (:meth:`first_token_s`)."""
        if not block_hashes:
            return
        if request_id is not None and request_id in self._requests:
            self.release(request_id)
        key, last = (namespace, worker_id), block_hashes[-1]
        entries = self._entries.setdefault(key, {})
        entry = entries.get(last)
        if entry is None:
            entry = entries[last] = _InFlightEntry(expires_s, tuple(block_hashes))
            self._push(key, last, expires_s)
            counts = self._counts.setdefault(key, {})
            for block_hash in block_hashes:
                counts[block_hash] = counts.get(block_hash, 0) + 1
            while len(counts) > self.max_blocks_per_worker and len(entries) > 1:
                self._remove(key, next(iter(entries)))
                self.capped_entries += 1
        elif expires_s > entry.expires_s:
            entry.expires_s = expires_s
            self._push(key, last, expires_s)
        if request_id is None:
            entry.anonymous = True
        else:
            entry.request_ids.add(request_id)
            self._requests[request_id] = (key, last)
        if first_token_s is not None:
            first = self._first.setdefault(key, {})
            for block_hash in block_hashes:
                if first.get(block_hash, -math.inf) < first_token_s:
                    first[block_hash] = first_token_s

    def holders(self, namespace: object, worker_id: int, block_hash: int) -> int:
        """In-flight chains on ``worker_id`` whose prefix holds ``block_hash`` (0 if none): each is a request
        queued there that will reference the block when admitted (identical chains count once)."""
        return self._counts.get((namespace, worker_id), {}).get(block_hash, 0)

    def first_token_s(self, namespace: object, worker_id: int, block_hash: int) -> float | None:
        """The latest predicted first-token time of the in-flight requests on ``worker_id`` whose prefix holds
        ``block_hash`` (the caller's clock), or None when none was given or the block is not in flight there.
        A request that left keeps its time on the block while other entries hold it (the latest is kept, not
        recomputed)."""
        key = (namespace, worker_id)
        if block_hash not in self._counts.get(key, {}):
            return None
        return self._first.get(key, {}).get(block_hash)

    def release(self, request_id: int, keep_until_s: float | None = None) -> bool:
        """Request ``request_id``'s first token came: it no longer counts (its entry leaves with its last
        request, or, given ``keep_until_s``, expires then: the time the store's KV event may take to reach
        the directory). Returns False for an id not held (never routed here, expired, released already)."""
        held = self._requests.pop(request_id, None)
        if held is None:
            return False
        key, last = held
        entry = self._entries[key][last]
        entry.request_ids.discard(request_id)
        if entry.request_ids or entry.anonymous:
            return True
        if keep_until_s is None:
            self._remove(key, last)
        else:
            entry.expires_s = keep_until_s
            self._push(key, last, keep_until_s)
        return True

    def match(self, namespace: object, block_hashes: Sequence[int], worker_ids: Sequence[int]) -> list[int]:
        """Leading blocks of ``block_hashes`` in flight to each worker, same order as ``worker_ids``."""
        result = []
        for worker_id in worker_ids:
            counts = self._counts.get((namespace, worker_id), {})
            n = 0
            while n < len(block_hashes) and block_hashes[n] in counts:
                n += 1
            result.append(n)
        return result

    def expire(self, now_s: float) -> int:
        """Drop the entries whose expiry time is ≤ ``now_s``. Returns entries dropped."""
        dropped = 0
        while self._expiry and self._expiry[0][0] <= now_s:
            expires_s, _, key, last = heapq.heappop(self._expiry)
            entry = self._entries.get(key, {}).get(last)
            if entry is not None and entry.expires_s == expires_s:  # else released, or extended (a later heap item)
                self._remove(key, last)
                dropped += 1
        return dropped

    def forget_worker(self, worker_id: int) -> int:
        """Drop every entry on ``worker_id`` in every namespace (its engine restarted: what was sent
        to the old process will never be stored). Returns entries dropped."""
        keys = [key for key in self._entries if key[1] == worker_id]
        dropped = 0
        for key in keys:
            for last in list(self._entries[key]):
                self._remove(key, last)
                dropped += 1
        return dropped

    def __len__(self) -> int:
        """Entries held, all workers."""
        return sum(len(entries) for entries in self._entries.values())

    def _push(self, key: tuple[object, int], last: int, expires_s: float) -> None:
        self._seq += 1
        heapq.heappush(self._expiry, (expires_s, self._seq, key, last))

    def _remove(self, key: tuple[object, int], last: int) -> None:
        entries, counts = self._entries[key], self._counts[key]
        entry = entries.pop(last)
        for request_id in entry.request_ids:
            self._requests.pop(request_id, None)
        first = self._first.get(key, {})
        for block_hash in entry.chain:
            counts[block_hash] -= 1
            if not counts[block_hash]:
                del counts[block_hash]
                first.pop(block_hash, None)
        if not entries:
            del self._entries[key], self._counts[key]
            self._first.pop(key, None)


@dataclass(slots=True)
class _InFlightEntry:
    """One routed chain on one ``(namespace, worker)``: when it expires, its hashes, the requests carrying
    it, and whether one was added without an id (then only its expiry removes it)."""

    expires_s: float
    chain: tuple[int, ...]
    request_ids: set[int] = field(default_factory=set)
    anonymous: bool = False
