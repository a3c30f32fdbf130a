"""The cache directory: which worker holds which prefix, in which tier, how fresh (DESIGN.md §2).

Reuse is exact: an entry is reusable only inside one :class:`Namespace`
(model, revision, adapter, block size, KV layout, cache salt) and only for the
exact chain of block hashes. Because block hashes are chained (h_i depends on
h_{i-1} and the tokens of block i, as in vLLM's prefix caching), a block hash
identifies its whole prefix. The radix tree over block sequences is therefore
stored as a node table ``hash -> node`` where each node keeps its parent hash
and its holders (worker -> tier); walking a request's hashes in order is a
walk from the root down the tree, and the first missing hash ends the match.

The directory is fed by events (a worker stored / removed blocks, or cleared
everything); it knows only what the events told it, so it can lag the workers.
A match is a hint, never a promise: the worker re-checks at admission.

Thread safety: not thread-safe; one owner (the router) applies events and
queries. Time is always passed in (``now_s``); nothing reads a clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kvcost.features.spec import TIER_CODES


@dataclass(frozen=True, slots=True)
class Namespace:
    """Compatibility key of a KV cache (DESIGN.md §2).

    Two requests can share KV only within the same namespace: same model and
    revision, adapter (LoRA), block size, KV layout (dtype, tensor-parallel
    split) and cache salt.
    """

    model: str
    revision: str = "main"
    adapter: str = ""
    block_size_tokens: int = 512
    kv_layout: str = "bf16-tp1"
    cache_salt: str = ""


@dataclass(slots=True)
class _Node:
    parent_hash: int | None
    holders: dict[int, str] = field(default_factory=dict)  # worker_id -> tier name


@dataclass(frozen=True, slots=True)
class DirectoryMatch:
    """Longest compatible prefix of one request on one worker.

    Attributes:
        worker_id: the candidate worker.
        reusable_blocks: number of leading full blocks the directory says the worker holds.
        tier: tier name of the deepest matched block (``"none"`` when 0 blocks).
        age_s: seconds since the directory last heard from this worker (``inf`` if never).
    """

    worker_id: int
    reusable_blocks: int
    tier: str
    age_s: float

    @property
    def tier_code(self) -> int:
        """Integer code of :attr:`tier` from ``TIER_CODES``."""
        return TIER_CODES[self.tier]


def reusable_tokens_for(reusable_blocks: int, block_size_tokens: int, input_tokens: int) -> int:
    """Tokens of a prompt that a cached prefix of ``reusable_blocks`` full blocks saves.

    At least one prompt token is always computed (its logits give the first
    output token), as vLLM does when a prompt is fully cached; so the result is
    ``min(reusable_blocks × block_size_tokens, input_tokens − 1)``, never negative.
    """
    return max(0, min(reusable_blocks * block_size_tokens, input_tokens - 1))


class CacheDirectory:
    """Radix index over chained block hashes, per namespace, with tiers and freshness.

    Example:
        >>> ns = Namespace("llama-3-8b")
        >>> d = CacheDirectory()
        >>> d.apply_stored(ns, worker_id=0, block_hashes=[11, 12], parent_hash=None, tier="gpu", now_s=1.0)
        >>> d.match(ns, [11, 12, 13], worker_ids=[0, 1], now_s=3.0)[0].reusable_blocks
        2
    """

    def __init__(self) -> None:
        self._trees: dict[Namespace, dict[int, _Node]] = {}
        self._last_event_s: dict[int, float] = {}

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

        Raises:
            ValueError: unknown tier name.
        """
        if tier not in TIER_CODES or tier == "none":
            raise ValueError(f"tier = {tier!r}, expected one of gpu, cpu, disk, remote")
        tree = self._trees.setdefault(namespace, {})
        parent = parent_hash
        for block_hash in block_hashes:
            node = tree.get(block_hash)
            if node is None:
                node = tree[block_hash] = _Node(parent)
            node.holders[worker_id] = tier
            parent = block_hash
        self._last_event_s[worker_id] = now_s

    def apply_removed(self, namespace: Namespace, worker_id: int, block_hashes: Iterable[int], now_s: float) -> None:
        """Record that ``worker_id`` dropped ``block_hashes``; nodes with no holder left are deleted."""
        tree = self._trees.get(namespace, {})
        for block_hash in block_hashes:
            node = tree.get(block_hash)
            if node is not None and node.holders.pop(worker_id, None) is not None and not node.holders:
                del tree[block_hash]
        self._last_event_s[worker_id] = now_s

    def clear_worker(self, worker_id: int, now_s: float) -> None:
        """Drop every entry of ``worker_id`` in every namespace (AllBlocksCleared, or an engine restart)."""
        for tree in self._trees.values():
            empty = [h for h, node in tree.items() if node.holders.pop(worker_id, None) and not node.holders]
            for block_hash in empty:
                del tree[block_hash]
        self._last_event_s[worker_id] = now_s

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
        tree = self._trees.get(namespace, {})
        depth = dict.fromkeys(worker_ids, 0)
        tier = dict.fromkeys(worker_ids, "none")
        alive = set(worker_ids)
        for i, block_hash in enumerate(block_hashes):
            node = tree.get(block_hash)
            if node is None:
                break
            alive.intersection_update(node.holders)
            if not alive:
                break
            for worker_id in alive:
                depth[worker_id] = i + 1
                tier[worker_id] = node.holders[worker_id]
        return [
            DirectoryMatch(w, depth[w], tier[w], now_s - self._last_event_s.get(w, float("-inf"))) for w in worker_ids
        ]

    def num_blocks(self, namespace: Namespace | None = None) -> int:
        """Distinct block hashes known (in one namespace, or all)."""
        if namespace is not None:
            return len(self._trees.get(namespace, {}))
        return sum(len(tree) for tree in self._trees.values())
