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
from collections import OrderedDict
from collections.abc import Sequence


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
    """Prefixes routed to a worker whose blocks the directory does not yet report stored.

    kvcost issue 13 §3: a family's next turn, arriving while its previous turn is
    still queued on worker A, finds nothing in the directory (it lists stored
    blocks only), yet under FCFS with chunked prefill the earlier request stores
    its prompt's blocks on A before this request's first chunk runs. The router
    knows those prefixes from what it routed (never from the worker's true
    queue), as Dynamo's predicted-TTL side index does for sibling bursts.

    An entry is one routed chain of block hashes (prompt order) on one
    ``(namespace, worker)``, keyed by its last hash (chained hashes: the last hash
    names the chain); routing the same chain there again only extends its expiry.
    It leaves when :meth:`confirm` sees the directory holding it there, or when its
    expiry time passes (:meth:`expire`). A block in the per-worker count is a
    prefix held by some entry, so :meth:`match` is a radix-tree prefix walk.

    Size: past ``max_blocks_per_worker`` distinct blocks on one ``(namespace, worker)``,
    the entries routed there longest ago are dropped (an entry lives seconds, so
    this binds only a flood of distinct prefixes).

    Cost: :meth:`add` O(chain), :meth:`match` O(matched blocks), :meth:`confirm`
    O(stored chain), :meth:`expire` O(log entries) per entry dropped (a heap with
    lazy deletion), so a route stays cheap however many entries are held.

    Thread safety: not thread-safe; one owner (a router).

    Example:
        >>> index = InFlightPrefixes()
        >>> index.add("ns", 0, [1, 2, 3], expires_s=5.0)
        >>> index.match("ns", [1, 2, 9], [0, 1])
        [2, 0]
        >>> index.confirm("ns", 0, [1, 2, 3, 4])
        1
        >>> index.match("ns", [1, 2, 9], [0, 1])
        [0, 0]
    """

    def __init__(self, max_blocks_per_worker: int = 1 << 20) -> None:
        if not (type(max_blocks_per_worker) is int and max_blocks_per_worker >= 1):
            raise ValueError(f"max_blocks_per_worker = {max_blocks_per_worker!r}, expected an integer ≥ 1")
        self.max_blocks_per_worker = max_blocks_per_worker
        #: Entries dropped because their ``(namespace, worker)`` passed ``max_blocks_per_worker`` blocks.
        self.capped_entries = 0
        # (namespace, worker) -> {last hash: (expires_s, chain)}, oldest added first; block hash -> entries holding it
        self._entries: dict[tuple[object, int], dict[int, tuple[float, tuple[int, ...]]]] = {}
        self._counts: dict[tuple[object, int], dict[int, int]] = {}
        self._expiry: list[tuple[float, int, tuple[object, int], int]] = []  # (expires_s, seq, key, last hash)
        self._seq = 0

    def add(self, namespace: object, worker_id: int, block_hashes: Sequence[int], expires_s: float) -> None:
        """Record that a request with ``block_hashes`` was routed to ``worker_id``; forget it at ``expires_s``
        (or later, if the same chain was routed there before with a later expiry)."""
        if not block_hashes:
            return
        key, last = (namespace, worker_id), block_hashes[-1]
        entries = self._entries.setdefault(key, {})
        known = entries.get(last)
        if known is not None:
            if expires_s <= known[0]:
                return
            entries[last] = (expires_s, known[1])
        else:
            entries[last] = (expires_s, tuple(block_hashes))
            counts = self._counts.setdefault(key, {})
            for block_hash in block_hashes:
                counts[block_hash] = counts.get(block_hash, 0) + 1
            while len(counts) > self.max_blocks_per_worker and len(entries) > 1:
                self._remove(key, next(iter(entries)))
                self.capped_entries += 1
        self._seq += 1
        heapq.heappush(self._expiry, (expires_s, self._seq, key, last))

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

    def confirm(self, namespace: object, worker_id: int, stored_hashes: Sequence[int]) -> int:
        """Drop the entries on ``worker_id`` whose blocks are all among ``stored_hashes``.

        Args:
            stored_hashes: a chain of block hashes (prompt order) the directory reports
                stored on the worker; an entry is stored when its last hash is one of them
                (chained hashes: its whole prefix is then stored too).

        Returns:
            Entries dropped.
        """
        key = (namespace, worker_id)
        entries = self._entries.get(key)
        if not entries:
            return 0
        done = [h for h in stored_hashes if h in entries]
        for last in done:
            self._remove(key, last)
        return len(done)

    def expire(self, now_s: float) -> int:
        """Drop the entries whose expiry time is ≤ ``now_s``. Returns entries dropped."""
        dropped = 0
        while self._expiry and self._expiry[0][0] <= now_s:
            expires_s, _, key, last = heapq.heappop(self._expiry)
            entry = self._entries.get(key, {}).get(last)
            if entry is not None and entry[0] == expires_s:  # else confirmed, or extended (a later heap item)
                self._remove(key, last)
                dropped += 1
        return dropped

    def forget_worker(self, worker_id: int) -> int:
        """Drop every entry on ``worker_id`` in every namespace (its engine restarted: what was sent
        to the old process will never be stored). Returns entries dropped."""
        keys = [key for key in self._entries if key[1] == worker_id]
        dropped = sum(len(self._entries[key]) for key in keys)
        for key in keys:
            del self._entries[key]
            self._counts.pop(key, None)
        return dropped

    def __len__(self) -> int:
        """Entries held, all workers."""
        return sum(len(entries) for entries in self._entries.values())

    def _remove(self, key: tuple[object, int], last: int) -> None:
        entries, counts = self._entries[key], self._counts[key]
        _, hashes = entries.pop(last)
        for block_hash in hashes:
            counts[block_hash] -= 1
            if not counts[block_hash]:
                del counts[block_hash]
        if not entries:
            del self._entries[key], self._counts[key]
