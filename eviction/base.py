"""The eviction-policy contract, the node table it ranks and the vectorised ranking (docs/architecture.md §5).

A policy maps a table of *idle* cached blocks (prefix nodes, reference count
0) to value terms; the node with the **lowest** ``value`` is evicted first.
The same policy object serves two callers:

* :func:`rank_nodes` — a vectorised ranking of a whole :class:`NodeTable`
  (the ``/v1/evict/rank`` endpoint, benchmarks);
* :class:`~kvcost.eviction.index.EvictionIndex` — the incremental
  index a simulated :class:`~kvcost.replay.kv_cache.BlockPool` uses.

Leaf rule: every policy except ``lru`` only evicts leaves of the idle forest
(an idle block none of whose children is cached). Evicting an idle parent
with cached children would orphan them: matching walks the chain from the
start and stops at the first miss, so the children could never be hit again.
SGLang's RadixCache evicts leaves only (``sglang/srt/mem_cache/radix_cache.py``,
``evict`` collects ``_collect_leaves``); vLLM's block pool does not (it pops
its free-block queue, ``vllm/v1/core/block_pool.py``), hence ``lru`` keeps
its exact vLLM order.

Policies are stateful (GDSF's inflation ``L``, LHD's age statistics) and are
built per pool by :func:`make_eviction_policy`; nothing is shared between
pools. No clock is read: every time is an argument.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields

import numpy as np

from kvcost.core.registry import Registry

#: Name → factory ``(EvictionContext) -> EvictionPolicy``; a duplicate name is an error.
EVICTION_POLICIES: Registry[Callable[[EvictionContext], EvictionPolicy]] = Registry("eviction policy")

#: Names of the value terms every ranking reports, in wire order.
VALUE_TERMS: tuple[str, ...] = ("p_reuse", "prefill_saved_s", "size_bytes", "restore_s", "value")


@dataclass(frozen=True)
class NodeTable:
    """Statistics of ``n`` idle cached prefix nodes (one KV block each), column arrays of shape ``(n,)``.

    Attributes:
        depth_blocks: int64, 0-based position of the block in its prefix (blocks before it), ≥ 0.
        hits: int64, times the block was reused since it was stored, ≥ 0.
        last_access_s: float64, last time the block was referenced or released (seconds, caller's clock).
        created_s: float64, time the block was stored, ≤ ``last_access_s``.
        size_bytes: float64, KV bytes the block holds, > 0.
        prefill_saved_s: float64, prefill seconds a hit on this block saves, ≥ 0.
        restore_s: float64, seconds to bring the block back from a lower tier if it is demoted
            instead of dropped; ``inf`` when it can only be dropped.
        flops_saved: float64, FLOPs a hit saves (``flop_aware``), ≥ 0.
        category: int64, request category code supplied by the caller (0 = unknown).
        request_blocks: int64, full prompt blocks of the last request that held the block, ≥ 1.
        parent: int64, row index of the node's parent in this table, −1 when the parent is not
            in the table (a root, or a parent that is in use).
        request_reused_blocks: int64, leading blocks of the last request that held the block found
            cached at its admission, in [0, ``request_blocks``] (default 0). A chain-level fact: a
            conversation's later turns reuse the earlier turns' blocks, so it separates first turns
            (≈ 1 shared block reused) from continuing conversations.
    """

    depth_blocks: np.ndarray
    hits: np.ndarray
    last_access_s: np.ndarray
    created_s: np.ndarray
    size_bytes: np.ndarray
    prefill_saved_s: np.ndarray
    restore_s: np.ndarray
    flops_saved: np.ndarray
    category: np.ndarray
    request_blocks: np.ndarray
    parent: np.ndarray = field(default=None)  # type: ignore[assignment]
    request_reused_blocks: np.ndarray = field(default=None)  # type: ignore[assignment]
    block_hash: np.ndarray = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        n = len(self.depth_blocks)
        if self.parent is None:
            object.__setattr__(self, "parent", np.full(n, -1, dtype=np.int64))
        if self.request_reused_blocks is None:
            object.__setattr__(self, "request_reused_blocks", np.zeros(n, dtype=np.int64))
        if self.block_hash is None:
            object.__setattr__(self, "block_hash", np.full(n, -1, dtype=np.int64))
        for f in fields(self):
            value = np.asarray(getattr(self, f.name))
            if value.shape != (n,):
                raise ValueError(f"{f.name} has shape {value.shape}, expected ({n},) like depth_blocks")
            object.__setattr__(self, f.name, value)
        if n and not np.all(self.size_bytes > 0):
            raise ValueError(f"size_bytes min = {float(self.size_bytes.min())!r}, expected every value > 0")
        if n and (self.parent.min() < -1 or self.parent.max() >= n):
            raise ValueError(
                f"parent range [{self.parent.min()}, {self.parent.max()}], expected −1 or a row in [0, {n})"
            )

    def __len__(self) -> int:
        return len(self.depth_blocks)

    def is_leaf(self) -> np.ndarray:
        """bool ``(n,)``: no node of the table names this node as its parent."""
        leaf = np.ones(len(self), dtype=bool)
        parents = self.parent[self.parent >= 0]
        leaf[parents] = False
        return leaf


@dataclass(frozen=True)
class EvictionContext:
    """What policies may know about the deployment; built once per pool.

    Attributes:
        horizon_s: reuse horizon H of ``cost_aware`` (P(reuse within H)), > 0.
        rerank_interval_s: time-varying policies re-rank every idle leaf at most this often (simulated s), > 0.
        reuse_model: ``cost_aware``'s classifier (anything with ``predict_proba(NodeTable, now_s) -> (n,)``),
            None = the recency prior of :func:`recency_prior`.
        flop_alpha: Marconi's α (weight of FLOP efficiency against recency), ≥ 0.
        next_use: the future of a known trace (anything with ``next_use_s(block_hashes, now_s) -> (n,)``,
            :class:`~kvcost.eviction.clairvoyant.NextUseTable`), read only by the ``clairvoyant``
            reference; None everywhere else.
    """

    horizon_s: float = 300.0
    rerank_interval_s: float = 10.0
    reuse_model: object | None = None
    flop_alpha: float = 1.0
    next_use: object | None = None

    def __post_init__(self) -> None:
        for name in ("horizon_s", "rerank_interval_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} = {value!r}, expected a finite number > 0")
        if not (self.flop_alpha >= 0 and math.isfinite(self.flop_alpha)):
            raise ValueError(f"flop_alpha = {self.flop_alpha!r}, expected a finite number ≥ 0")


class EvictionPolicy:
    """Base class: value terms of idle nodes; lowest ``value`` is evicted first.

    Class attributes:
        name: registry name.
        leaves_only: True = only leaves of the idle forest are candidates.
        time_varying: True = values change with ``now_s`` alone, so the incremental index
            re-ranks every ``rerank_interval_s``; False = a value is fixed when the block turns idle.
        pool_native: True = a simulated block pool runs the policy itself, exactly (``lru``:
            vLLM's ordered free-block queue), so it needs no :class:`~kvcost.eviction.index.EvictionIndex`.
        uses_reuse_model: True = the value needs ``context.reuse_model`` (P(reuse), ``cost_aware``).
        reads_future: True = the value reads ``context.next_use``, the future of a known trace
            (``clairvoyant``): an offline reference for replays, never offered by the service.

    Hooks (default no-ops) let stateful policies learn: :meth:`on_hit` when an idle
    block is reused, :meth:`on_evict` when one is evicted.
    """

    name = "base"
    leaves_only = True
    time_varying = False
    pool_native = False
    uses_reuse_model = False
    reads_future = False

    def __init__(self, context: EvictionContext) -> None:
        self.context = context

    def terms(self, nodes: NodeTable, now_s: float) -> dict[str, np.ndarray]:
        """Value terms, each float64 ``(n,)``: at least ``value`` (lower = evict first); see :data:`VALUE_TERMS`."""
        raise NotImplementedError

    def score_new(self, nodes: NodeTable, now_s: float) -> np.ndarray:
        """``value`` of blocks that just turned idle, scored between re-ranks (default: ``terms``)."""
        return self.terms(nodes, now_s)["value"]

    def on_hit(self, hits: int, idle_age_s: float) -> None:
        """An idle block with ``hits`` earlier hits was reused after ``idle_age_s`` seconds idle."""

    def on_evict(self, value: float, hits: int, idle_age_s: float) -> None:
        """A block of ``value`` with ``hits`` hits was evicted after ``idle_age_s`` seconds idle."""


def base_terms(nodes: NodeTable, value: np.ndarray, p_reuse: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The :data:`VALUE_TERMS` dict for ``value`` (``p_reuse`` NaN when the policy has none)."""
    n = len(nodes)
    return {
        "p_reuse": p_reuse if p_reuse is not None else np.full(n, np.nan),
        "prefill_saved_s": nodes.prefill_saved_s.astype(np.float64),
        "size_bytes": nodes.size_bytes.astype(np.float64),
        "restore_s": nodes.restore_s.astype(np.float64),
        "value": np.asarray(value, dtype=np.float64),
    }


@dataclass(frozen=True)
class Ranking:
    """Result of :func:`rank_nodes`.

    Attributes:
        order: int64 ``(n,)``, row indices of the nodes in eviction order (first = evicted first).
        terms: the policy's value terms per row (not reordered), float64 ``(n,)`` each.
    """

    order: np.ndarray
    terms: dict[str, np.ndarray]


def rank_nodes(policy: EvictionPolicy, nodes: NodeTable, now_s: float) -> Ranking:
    """Full eviction order of ``nodes`` under ``policy`` at ``now_s``, vectorised.

    Ties go to the older ``last_access_s``, then the deeper block (vLLM frees
    a request's blocks tail first), then the row. For leaf-only policies a
    parent can only go after all its children; with values fixed, repeatedly
    evicting the lowest-value leaf equals sorting by the subtree maximum
    ``k(node) = max(value(node), k(children))`` with those tie-breaks (a parent
    is referenced whenever its child is, so it is never older than the child,
    and on equal age the deeper child goes first).
    ``k`` is propagated level by level from the deepest nodes (one vectorised
    step per depth level). The age tie-break is the subtree's latest access, so
    a caller whose child blocks are stamped later than their parents (e.g.
    with the time each block was stored) still gets every child before its parent.

    Raises:
        ValueError: ``now_s`` is not finite.
    """
    if not math.isfinite(now_s):
        raise ValueError(f"now_s = {now_s!r}, expected a finite time in seconds")
    terms = policy.terms(nodes, now_s)
    key = terms["value"].copy()
    last_access_s = nodes.last_access_s
    if policy.leaves_only and len(nodes):
        key = subtree_max(key, nodes.parent, nodes.depth_blocks)
        child = np.flatnonzero(nodes.parent >= 0)
        if np.any(last_access_s[child] > last_access_s[nodes.parent[child]]):  # else it is its own subtree max
            last_access_s = subtree_max(last_access_s, nodes.parent, nodes.depth_blocks)
    order = np.lexsort((-nodes.depth_blocks, last_access_s, key))  # stable: the row breaks the last ties
    return Ranking(order=order.astype(np.int64), terms=terms)


def subtree_max(value: np.ndarray, parent: np.ndarray, depth_blocks: np.ndarray) -> np.ndarray:
    """``k(i) = max(value(i), k(children of i))``, float64 ``(n,)``; children must be deeper than parents.

    Raises:
        ValueError: a node's parent is not strictly shallower.
    """
    key = value.astype(np.float64).copy()
    has_parent = parent >= 0
    if not has_parent.any():
        return key
    if np.any(depth_blocks[parent[has_parent]] >= depth_blocks[has_parent]):
        raise ValueError("parent: a node's parent must have a smaller depth_blocks than the node")
    child = np.flatnonzero(has_parent)
    child = child[np.argsort(-depth_blocks[child], kind="stable")]
    levels = depth_blocks[child]
    bounds = np.flatnonzero(np.diff(levels)) + 1
    for group in np.split(child, bounds):
        np.maximum.at(key, parent[group], key[group])
    return key


def recency_prior(nodes: NodeTable, now_s: float, horizon_s: float) -> np.ndarray:
    """Fallback P(reuse within ``horizon_s``) = exp(−idle seconds / ``horizon_s``), float64 ``(n,)`` in (0, 1].

    Assumption (no trained classifier): reuse is memoryless with a mean gap of
    the horizon, so a block idle for longer is less likely to be reused.
    """
    idle_s = np.maximum(0.0, now_s - nodes.last_access_s)
    return np.exp(-idle_s / horizon_s)


def deployable_policies() -> list[str]:
    """Names of the registered policies that do not read the future (every one but ``clairvoyant``),
    in registration order: what the service and an engine's cache may run."""
    return [name for name in EVICTION_POLICIES if not EVICTION_POLICIES.get(name).reads_future]


def make_eviction_policy(name: str, context: EvictionContext | None = None) -> EvictionPolicy:
    """A fresh policy instance (its own state) for one pool.

    Raises:
        KeyError: unknown name (the message lists the registered ones).
    """
    return EVICTION_POLICIES.get(name)(context if context is not None else EvictionContext())
