"""kvcost's eviction ranking for a store that sees only chunk keys: LMCache's CPU and disk tiers.

LMCache (``lmcache.v1.storage_backend.cache_policy``) hands its eviction policy
nothing but keys: ``update_on_put(key)`` when a chunk is stored,
``update_on_hit(key, cache)`` when one is reused, ``update_on_force_evict(key)``
when one is removed from outside, and ``get_evict_candidates(cache, n)`` when
memory runs out. A chunk's key is a hash chained over its prefix (256 tokens a
chunk by default), so neither its depth nor its parent can be read from it.
:class:`ChunkRanker` keeps what kvcost's policies need (:class:`~kvcost.eviction.base.NodeTable`)
from that event stream and ranks with any registered kvcost policy
(``cost_aware``, ``gdsf``, ``lhd``, ``lru`` …), the same code the simulator
and ``/v1/evict/rank`` use.

**The chain, inferred.** LMCache's local backends look a request's chunks up
in prefix order, touch the hits deepest first (``LocalCPUBackend.touch_cache``
reverses them) and then store the new chunks in prefix order
(``batched_submit_put_task``). So a chunk stored within ``chain_window_s`` of
the previous event on the store continues that chain: its parent is the last
chunk stored, or the deepest chunk touched in the hit run just before it.
Otherwise it starts a chain (depth 0). Where two requests' events interleave
within the window, a chunk can get the wrong parent: its depth, hence its
prefill seconds, is then off, and the leaf rule may keep a chunk one step
longer than it should. A wrong parent never makes a chunk unevictable: the
ranking covers every evictable chunk.

**Orphans go first.** A chain is only reusable up to its first missing chunk
(LMCache retrieves the longest stored prefix). When a chunk leaves the store,
its stored descendants can never be hit again; they are ranked as saving
nothing, so they are evicted before anything useful. LMCache's own LRU keeps
them until they age out.

**Cost.** Events are O(1). A ranking is :func:`~kvcost.eviction.base.rank_nodes`
over the evictable chunks, O(n log n); it is kept and consumed in order until
``rerank_interval_s`` passes or it runs out, skipping chunks touched or removed
since. Chunks stored after a ranking are not candidates until the next one
(they are the most recent, which every policy here keeps longest).

Thread safety: not thread-safe; LMCache calls its policy under the backend's lock.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from kvcost.eviction.base import EvictionPolicy, NodeTable, rank_nodes

#: Events closer than this (seconds) on one store belong to one request's chain (LMCache looks up,
#: touches and stores one request's chunks in one call each; requests are seconds apart at most
#: loads, and a wrong link costs little, see the module docstring).
DEFAULT_CHAIN_WINDOW_S = 0.05
#: A ranking is reused for at most this long (seconds): values change with idle time.
DEFAULT_RERANK_INTERVAL_S = 1.0


class _SizeLookup(Protocol):
    """What :meth:`ChunkRanker.candidates` reads of ``sizes``: membership and bytes per key."""

    def __contains__(self, key: object) -> bool: ...

    def __getitem__(self, key: Hashable) -> float: ...


@dataclass(slots=True)
class _Chunk:
    depth: int
    parent: Hashable | None
    created_s: float
    last_access_s: float
    hits: int = 0
    version: int = 0
    orphan: bool = False


class ChunkRanker:
    """Tracks the chunks one store holds and names the ones to evict under a kvcost policy.

    Args:
        policy: a kvcost eviction policy (:func:`~kvcost.eviction.base.make_eviction_policy`).
        prefill_saved_s: float ``(D,)``, prefill seconds a hit on the chunk at depth d saves
            (:func:`~kvcost.eviction.prefill.prefill_saved_table` with the chunk size as the block);
            depths past the table use its last entry.
        flops_saved: float ``(D,)``, FLOPs a hit at depth d saves (``flop_aware``); default zeros.
        restore_s: seconds to bring an evicted chunk back from a lower tier; inf = dropped (≥ 0).
        chain_window_s: events closer than this continue one chain (> 0, seconds).
        rerank_interval_s: a ranking is reused at most this long (> 0, seconds).
        clock: seconds, monotonic (default ``time.monotonic``).

    Raises:
        ValueError: an empty or negative ``prefill_saved_s``, a ``flops_saved`` of another
            shape, a negative ``restore_s``, or a window or interval that is not > 0.

    Example:
        >>> from kvcost.eviction import make_eviction_policy
        >>> times = [0.0, 0.01, 5.0, 5.01]
        >>> ranker = ChunkRanker(make_eviction_policy("gdsf"), np.array([1.0, 2.0]), clock=lambda: times[-1])
        >>> for t, key in zip(times[:], ("a0", "a1", "b0", "b1")):
        ...     times.append(t)
        ...     ranker.on_put(key)
        >>> times.append(9.0)
        >>> ranker.candidates(2, sizes=dict.fromkeys(("a0", "a1", "b0", "b1"), 1.0))
        ['a1', 'a0']
    """

    def __init__(
        self,
        policy: EvictionPolicy,
        prefill_saved_s: np.ndarray,
        flops_saved: np.ndarray | None = None,
        restore_s: float = math.inf,
        chain_window_s: float = DEFAULT_CHAIN_WINDOW_S,
        rerank_interval_s: float = DEFAULT_RERANK_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        saved = np.asarray(prefill_saved_s, dtype=np.float64)
        if saved.ndim != 1 or not len(saved) or not np.all(saved >= 0):
            raise ValueError(f"prefill_saved_s = {saved!r}, expected a non-empty 1-D array of seconds ≥ 0")
        flops = np.zeros_like(saved) if flops_saved is None else np.asarray(flops_saved, dtype=np.float64)
        if flops.shape != saved.shape:
            raise ValueError(f"flops_saved has shape {flops.shape}, expected {saved.shape} like prefill_saved_s")
        if not restore_s >= 0:
            raise ValueError(f"restore_s = {restore_s!r}, expected seconds ≥ 0 (inf = dropped)")
        for name, value in (("chain_window_s", chain_window_s), ("rerank_interval_s", rerank_interval_s)):
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} = {value!r}, expected a finite number of seconds > 0")
        self.policy, self.restore_s = policy, float(restore_s)
        self.chain_window_s, self.rerank_interval_s = chain_window_s, rerank_interval_s
        self._saved_s, self._flops, self._clock = saved, flops, clock
        self._chunks: dict[Hashable, _Chunk] = {}
        self._children: dict[Hashable, set[Hashable]] = {}
        self._cursor: Hashable | None = None  # the chunk a store arriving now would extend
        self._last_event_s = -math.inf
        self._ranked: list[tuple[Hashable, int, float]] = []  # (key, version, value), last = evicted first
        self._ranked_s = -math.inf

    def __len__(self) -> int:
        """Chunks tracked."""
        return len(self._chunks)

    def on_put(self, key: Hashable) -> None:
        """A chunk was stored (a key stored again is a hit)."""
        if key in self._chunks:
            self.on_hit(key)
            return
        now = self._clock()
        parent = self._cursor if now - self._last_event_s <= self.chain_window_s else None
        depth = self._chunks[parent].depth + 1 if parent in self._chunks else 0
        self._chunks[key] = _Chunk(depth, parent if depth else None, now, now)
        if depth:
            self._children.setdefault(parent, set()).add(key)
        self._cursor, self._last_event_s = key, now

    def on_hit(self, key: Hashable) -> None:
        """A stored chunk was reused; unknown keys are ignored (stored before this policy started)."""
        chunk = self._chunks.get(key)
        if chunk is None:
            return
        now = self._clock()
        self.policy.on_hit(chunk.hits, max(0.0, now - chunk.last_access_s))
        chunk.hits += 1
        chunk.last_access_s = now
        chunk.version += 1
        in_run = now - self._last_event_s <= self.chain_window_s and self._cursor in self._chunks
        if not in_run or chunk.depth > self._chunks[self._cursor].depth:
            self._cursor = key
        self._last_event_s = now

    def on_remove(self, key: Hashable) -> None:
        """A chunk left the store (evicted here or removed from outside); its descendants become orphans."""
        chunk = self._chunks.pop(key, None)
        if chunk is None:
            return
        if chunk.parent is not None:
            self._children.get(chunk.parent, set()).discard(key)
        pending = list(self._children.pop(key, ()))
        while pending:  # every stored descendant: none can be reached again
            descendant = pending.pop()
            child = self._chunks.get(descendant)
            if child is not None and not child.orphan:
                child.orphan = True
                child.version += 1
                pending += self._children.get(descendant, ())
        if self._cursor == key:
            self._cursor = None

    def candidates(
        self,
        n: int,
        sizes: Mapping[Hashable, float] | _SizeLookup,
        evictable: Callable[[Hashable], bool] = lambda key: True,
    ) -> list[Hashable]:
        """Up to ``n`` chunks to evict, first to go first; each is forgotten here (the caller evicts it).

        Args:
            n: how many, ≥ 1.
            sizes: bytes each chunk holds, for every tracked key the caller still stores (a key
                missing here is no longer stored and is forgotten).
            evictable: False for a chunk the caller cannot evict now (pinned, in use).

        Raises:
            ValueError: ``n`` < 1.
        """
        if n < 1:
            raise ValueError(f"n = {n!r}, expected an integer ≥ 1")
        out: list[Hashable] = []
        for attempt in range(2):
            if attempt or self._clock() - self._ranked_s > self.rerank_interval_s:
                self._rerank(sizes, evictable)
            out += self._take(n - len(out), sizes, evictable)
            if len(out) == n or attempt:
                break
        return out

    def _take(self, n: int, sizes, evictable) -> list[Hashable]:
        """Pop up to ``n`` chunks off the ranking, still current and evictable; each leaves the tracker."""
        out = []
        now = self._clock()
        while self._ranked and len(out) < n:
            key, version, value = self._ranked.pop()
            chunk = self._chunks.get(key)
            if chunk is None or chunk.version != version or key not in sizes or not evictable(key):
                continue
            self.policy.on_evict(value, chunk.hits, max(0.0, now - chunk.last_access_s))
            self.on_remove(key)
            out.append(key)
        return out

    def _rerank(self, sizes, evictable) -> None:
        for key in [k for k in self._chunks if k not in sizes]:
            self.on_remove(key)
        keys = [k for k in self._chunks if evictable(k)]
        self._ranked_s = self._clock()
        self._ranked = []
        if not keys:
            return
        table = self._table(keys, sizes)
        ranking = rank_nodes(self.policy, table, self._ranked_s)
        value = ranking.terms["value"].tolist()
        self._ranked = [(keys[i], self._chunks[keys[i]].version, value[i]) for i in ranking.order[::-1].tolist()]

    def _table(self, keys: list[Hashable], sizes: Mapping[Hashable, float]) -> NodeTable:
        chunks = [self._chunks[k] for k in keys]
        row = {k: i for i, k in enumerate(keys)}
        depth = np.array([c.depth for c in chunks], dtype=np.int64)
        index = np.minimum(depth, len(self._saved_s) - 1)
        orphan = np.array([c.orphan for c in chunks])
        parent = np.array([row.get(c.parent, -1) if c.parent is not None else -1 for c in chunks], dtype=np.int64)
        return NodeTable(
            depth_blocks=depth,
            hits=np.array([c.hits for c in chunks], dtype=np.int64),
            last_access_s=np.array([c.last_access_s for c in chunks]),
            created_s=np.array([c.created_s for c in chunks]),
            size_bytes=np.array([max(1.0, float(sizes[k])) for k in keys]),
            prefill_saved_s=np.where(orphan, 0.0, self._saved_s[index]),
            restore_s=np.full(len(keys), self.restore_s),
            flops_saved=np.where(orphan, 0.0, self._flops[index]),
            category=np.zeros(len(keys), dtype=np.int64),
            request_blocks=depth + 1,
            parent=parent,
        )
