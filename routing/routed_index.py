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
