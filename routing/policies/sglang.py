"""The ``sglang_cache_aware`` baseline: the SGLang router's ``cache_aware`` policy (docs/architecture.md §7).

Sources read:

- lightseekorg/smg (the SGLang model gateway, formerly sgl-project/sglang ``sgl-router``),
  ``src/policies/cache_aware.rs``: ``select_worker``, ``select_worker_min_load``,
  ``select_worker_with_text`` / ``select_worker_with_tokens`` (the rule below).
- lightseekorg/smg ``src/policies/tree.rs``: the approximate radix tree (one tree,
  many tenants = workers; per-tenant character counts; LRU-leaf eviction by
  ``evict_tenant_by_size``).
- lightseekorg/smg ``bindings/python/src/smg/router_args.py``: the launch defaults
  ``cache_threshold=0.3``, ``balance_abs_threshold=64``, ``balance_rel_threshold=1.5``,
  ``eviction_interval_secs=60``, ``max_tree_size=2**26``. (The Rust
  ``CacheAwareConfig::default()`` — 0.5 / 32 / 1.1 / 30 s / 10 000 — applies only
  when the policy is built in code without the CLI.)
- sgl-project/sglang ``sgl-router/src/policies/cache_aware.rs`` (older releases):
  below the threshold it picked ``tree.get_smallest_tenant()``.
"""

from __future__ import annotations

import numpy as np

from kvcost.routing.policies.base import DEFAULT_SEED, ROUTER_POLICIES, PolicyContext, RouterPolicy
from kvcost.routing.routed_index import RoutedPrefixIndex

#: ``--cache-threshold`` (smg router_args.py): minimum prefix match rate for cache routing.
DEFAULT_CACHE_THRESHOLD = 0.3
#: ``--balance-abs-threshold`` (smg router_args.py): load spread (max − min requests) for imbalance.
DEFAULT_BALANCE_ABS_THRESHOLD = 64
#: ``--balance-rel-threshold`` (smg router_args.py): imbalance also needs max > rel × min.
DEFAULT_BALANCE_REL_THRESHOLD = 1.5
#: ``--eviction-interval-secs`` (smg router_args.py): period of the LRU trim of the trees.
DEFAULT_EVICTION_INTERVAL_S = 60.0
#: Characters per token used to convert SGLang's character-based tree size (assumption:
#: ~4 characters per token for English text with BPE tokenizers).
CHARS_PER_TOKEN = 4
#: ``--max-tree-size`` = 2**26 characters per tenant (smg router_args.py), in tokens: 2**26 / 4 = 2**24.
DEFAULT_MAX_TREE_SIZE_TOKENS = 2**26 // CHARS_PER_TOKEN
#: Worker chosen when the match rate is at or below the threshold: ``"min_load"``
#: (current smg code) or ``"smallest_tree"`` (older sgl-router code, and still the
#: header comment of cache_aware.rs).
LOW_MATCH_TARGETS = ("min_load", "smallest_tree")


def inflight_requests(ctx: PolicyContext) -> np.ndarray:
    """Per-candidate in-flight requests (waiting + running), int64 ``(n,)``: SGLang's ``worker.load()``."""
    return np.array([s.waiting_requests + s.running_requests for s in ctx.snapshots], dtype=np.int64)


@ROUTER_POLICIES.register("sglang_cache_aware")
class SGLangCacheAwarePolicy(RouterPolicy):
    """SGLang router ``cache_aware``: shortest queue when imbalanced, else approximate-tree affinity.

    Source: lightseekorg/smg ``src/policies/cache_aware.rs`` and ``src/policies/tree.rs``
    (see the module docstring for every file read).

    Rule (load = in-flight requests of a worker):

    1. Imbalanced if ``max − min > balance_abs_threshold`` **and**
       ``max > balance_rel_threshold × min`` → the least-loaded worker (first on ties,
       Rust ``min_by_key``).
    2. Otherwise match the request against the approximate tree of routed requests:
       ``match_rate = matched / input`` for the worker with the longest match.
       ``match_rate > cache_threshold`` → that worker; else the least-loaded worker
       (``low_match_target="min_load"``, current smg code) or the worker with the
       smallest tree (``"smallest_tree"``, older sgl-router code).
    3. In every branch the request is inserted into the chosen worker's tree
       (:meth:`on_routed`); every ``eviction_interval_s`` each worker's tree is
       LRU-trimmed to ``max_tree_size_tokens``.

    Defaults (smg ``bindings/python/src/smg/router_args.py``, the launch defaults):
    cache_threshold 0.3, balance_abs_threshold 64, balance_rel_threshold 1.5,
    eviction_interval_s 60, max_tree_size 2**26 characters → 2**24 tokens
    (:data:`CHARS_PER_TOKEN` = 4). ``low_match_target="min_load"``.

    Discrepancy, stated: the header comment of cache_aware.rs (and the older
    sgl-project/sglang ``sgl-router`` code, ``tree.get_smallest_tenant()``) send a
    low-match request to the worker with the *smallest tree*; the current smg code
    sends it to the *least-loaded* worker (``min_by_key(load)``, comment "Low cache
    match: use worker with minimum load"), as docs/architecture.md §7 says. The default follows
    the current code; ``low_match_target="smallest_tree"`` gives the older behaviour.

    Approximations:

    - Load = ``waiting_requests + running_requests`` of the snapshot; SGLang counts
      requests it sent and has not seen finish (the same set, plus requests in transit).
    - The tree holds chained block hashes (:class:`RoutedPrefixIndex`, one set per
      worker) instead of raw characters: matches and sizes are in whole blocks
      (matched tokens = blocks × block size, capped at the input length), where
      SGLang matches character by character. Hashes of one request are inserted
      root-last so that the LRU trim drops the deepest blocks first, as SGLang's
      leaf-first eviction does.
    - Trim time: the first decision starts the 60 s clock (SGLang starts it when
      the router starts); ticks missed between decisions collapse into one trim.
    - Ties in the longest match go to the lowest candidate index. lightseekorg/smg
      (``crates/kv_index/src/string_tree.rs``) returns the node's ``last_tenant``
      instead: the worker that created the node, while it still holds it; a replay
      with that rule measured the same (``docs/routing-baselines.md``). Ties in tree
      size go to the lowest index.
    - Candidates are all workers: kvcost's hot-spot skew limit (``ctx.allowed``)
      is not part of SGLang.

    Args:
        cache_threshold: in [0, 1].
        balance_abs_threshold: ≥ 0 requests.
        balance_rel_threshold: ≥ 0.
        eviction_interval_s: > 0 seconds.
        max_tree_size_tokens: ≥ 0 tokens per worker.
        low_match_target: one of :data:`LOW_MATCH_TARGETS`.
        seed: unused (no tie is broken at random); accepted like every policy's.

    Raises:
        ValueError: an argument out of range (the message names it).

    Thread safety: not thread-safe (the trees change on every decision).
    """

    name = "sglang_cache_aware"

    def __init__(
        self,
        *,
        cache_threshold: float = DEFAULT_CACHE_THRESHOLD,
        balance_abs_threshold: int = DEFAULT_BALANCE_ABS_THRESHOLD,
        balance_rel_threshold: float = DEFAULT_BALANCE_REL_THRESHOLD,
        eviction_interval_s: float = DEFAULT_EVICTION_INTERVAL_S,
        max_tree_size_tokens: int = DEFAULT_MAX_TREE_SIZE_TOKENS,
        low_match_target: str = "min_load",
        seed: int = DEFAULT_SEED,
    ) -> None:
        super().__init__(seed=seed)
        if not 0.0 <= cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold = {cache_threshold}, expected a value in [0, 1]")
        if balance_abs_threshold < 0:
            raise ValueError(f"balance_abs_threshold = {balance_abs_threshold}, expected ≥ 0")
        if not balance_rel_threshold >= 0:
            raise ValueError(f"balance_rel_threshold = {balance_rel_threshold}, expected ≥ 0")
        if not eviction_interval_s > 0:
            raise ValueError(f"eviction_interval_s = {eviction_interval_s}, expected > 0")
        if max_tree_size_tokens < 0:
            raise ValueError(f"max_tree_size_tokens = {max_tree_size_tokens}, expected ≥ 0")
        if low_match_target not in LOW_MATCH_TARGETS:
            raise ValueError(f"low_match_target = {low_match_target!r}, expected one of {', '.join(LOW_MATCH_TARGETS)}")
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.eviction_interval_s = eviction_interval_s
        self.max_tree_size_tokens = max_tree_size_tokens
        self.low_match_target = low_match_target
        self.tree = RoutedPrefixIndex()
        self._next_eviction_s: float | None = None

    def _maybe_evict(self, now_s: float, block_size_tokens: int) -> None:
        """Trim every worker's tree when an eviction tick is due (the first call starts the clock)."""
        if self._next_eviction_s is None:
            self._next_eviction_s = now_s + self.eviction_interval_s
            return
        if now_s < self._next_eviction_s:
            return
        self.tree.trim(self.max_tree_size_tokens // block_size_tokens)
        missed_ticks = (now_s - self._next_eviction_s) // self.eviction_interval_s
        self._next_eviction_s += (missed_ticks + 1) * self.eviction_interval_s

    def choose(self, ctx: PolicyContext) -> tuple[int, str]:
        """Shortest queue if imbalanced, else best match above the threshold, else min load / smallest tree."""
        request = ctx.request
        block_size = request.namespace.block_size_tokens
        self._maybe_evict(ctx.now_s, block_size)
        load = inflight_requests(ctx)
        high, low = int(load.max()), int(load.min())
        if high - low > self.balance_abs_threshold and high > self.balance_rel_threshold * low:
            index = int(np.argmin(load))
            return index, (
                f"imbalanced: max {high} − min {low} > {self.balance_abs_threshold} and "
                f"{high} > {self.balance_rel_threshold:g} × {low} → shortest queue worker "
                f"{ctx.snapshots[index].worker_id} (load {load[index]})"
            )
        worker_ids = [s.worker_id for s in ctx.snapshots]
        matched_blocks = self.tree.match(request.block_hashes, worker_ids)
        matched = np.minimum(np.array(matched_blocks, dtype=np.int64) * block_size, request.input_tokens)
        best = int(np.argmax(matched))
        rate = float(matched[best]) / request.input_tokens
        summary = f"matched {matched[best]} of {request.input_tokens} tokens = {rate:.2f}"
        if rate > self.cache_threshold:
            return best, f"cache hit: {summary} > {self.cache_threshold:g} → best-match worker {worker_ids[best]}"
        if self.low_match_target == "min_load":
            index = int(np.argmin(load))
            return index, (
                f"low match: {summary} ≤ {self.cache_threshold:g} → least-loaded worker "
                f"{worker_ids[index]} (load {load[index]})"
            )
        sizes = np.array([self.tree.size_blocks(w) * block_size for w in worker_ids], dtype=np.int64)
        index = int(np.argmin(sizes))
        return index, (
            f"low match: {summary} ≤ {self.cache_threshold:g} → smallest-tree worker "
            f"{worker_ids[index]} ({sizes[index]} tokens)"
        )

    def on_routed(self, ctx: PolicyContext, index: int) -> None:
        """Insert the request's blocks into the chosen worker's tree (root last, so it is most recent)."""
        worker_id = ctx.snapshots[index].worker_id
        self.tree.insert(worker_id, ctx.request.block_hashes, ctx.now_s)
