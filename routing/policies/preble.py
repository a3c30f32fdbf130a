"""The ``preble_e2`` baseline: Preble's E2 global scheduler (docs/architecture.md §7).

Sources read:

- Srivatsa et al., "Preble: Efficient Distributed Prompt Scheduling for LLM
  Serving", ICLR 2025 (arXiv:2407.00023), §3 (the E2 algorithm: exploit / explore
  and the per-GPU cost = windowed load + eviction cost + the request's prefill).
- WukLab/preble ``multi_node/global_scheduler_with_time.py``: ``runtime_selector``
  (exploit when the request's new tokens are fewer than its cached tokens, else
  argmin of the per-GPU cost), ``SlidingWindowHistogram`` (``window_duration =
  timedelta(minutes=3)``; entries older than the window are dropped),
  ``get_node_cost`` (prefill of misses + decode = output length × TPOT),
  ``virtual_evict_for_routing`` / ``get_eviction_prefill_cost`` (eviction priced at
  the evicted prefixes' prefill time × their windowed hits).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from kvcost.core.hardware import StepTimeModel
from kvcost.core.types import WorkerSnapshot
from kvcost.routing.policies.base import DEFAULT_SEED, ROUTER_POLICIES, PolicyContext, RouterPolicy
from kvcost.routing.routed_index import RoutedPrefixIndex

#: History window H in seconds: ``SlidingWindowHistogram(window_duration=timedelta(minutes=3))``
#: in WukLab/preble multi_node/global_scheduler_with_time.py.
DEFAULT_WINDOW_S = 180.0
#: Output tokens the router expects per request (it cannot know them): the mean output of
#: the Mooncake conversation trace, 343 tokens (the figure behind kvcost.routing.router's
#: ``DEFAULT_EXPECTED_DECODE_TOKENS`` = 172 remaining per running request). Preble uses the
#: request's ``max_new_tokens`` (default 45) and later the prefix's observed mean output.
DEFAULT_EXPECTED_OUTPUT_TOKENS = 343


@dataclass(frozen=True, slots=True)
class PrebleCosts:
    """Per-candidate E2 terms, each ``(n,)``: seconds (float64), ``cost_s = load_s + prefill_s + eviction_s``.

    ``matched_tokens`` (int64) is the prefix the global tree says each candidate holds.
    """

    matched_tokens: np.ndarray
    load_s: np.ndarray
    prefill_s: np.ndarray
    eviction_s: np.ndarray
    cost_s: np.ndarray


@dataclass(frozen=True, slots=True)
class _Routed:
    """One routed request in the history window."""

    time_s: float
    worker_id: int
    work_s: float
    hit_blocks: int


def decode_step_s(step_model: StepTimeModel, snapshot: WorkerSnapshot, input_tokens: int) -> float:
    """Nominal time per output token on the worker: one decode step with the request joining the batch.

    ``step_s(running + 1, 0, decode_context_tokens + input_tokens)`` (Preble uses the GPU's measured TPOT).
    """
    return step_model.step_s(snapshot.running_requests + 1, 0.0, snapshot.decode_context_tokens + input_tokens)


@ROUTER_POLICIES.register("preble_e2")
class PrebleE2Policy(RouterPolicy):
    """Preble E2: exploit a GPU holding the prefix when it covers most of the prompt, else explore by cost.

    Source: Preble (ICLR 2025) §3 and WukLab/preble
    ``multi_node/global_scheduler_with_time.py`` (see the module docstring).

    Rule, for a request of ``input`` tokens with matched prefix ``m_i`` on GPU i
    (from the global tree of routed requests) and ``m = max_i m_i``:

    - **Exploit** if ``input − m < m`` (fewer missed than cached tokens): among the
      GPUs holding that longest prefix (``m_i = m``), the lowest cost.
    - **Explore** otherwise: the lowest cost over all GPUs.
    - ``cost_i = L_i + P_i + M_i`` (seconds; lowest index on ties):

      - ``L_i`` windowed load: over requests routed to i in the last ``window_s``,
        Σ prefill time of their missed tokens + ``expected_output_tokens`` × the
        per-token decode time (:func:`decode_step_s`) at their routing time.
      - ``P_i`` the request's own prefill on i: ``prefill_alone_s(input − m_i, m_i)``.
      - ``M_i`` eviction cost: the KV blocks the request's missed tokens need beyond
        free memory are taken from the idle cached blocks; priced at their
        recompute time ``prefill_alone_s(evicted tokens)`` × their hit frequency.

    Defaults: ``window_s`` 180 (3 min, ``SlidingWindowHistogram`` in the repo);
    ``expected_output_tokens`` :data:`DEFAULT_EXPECTED_OUTPUT_TOKENS` (assumption);
    ``kv_capacity_blocks`` None = the worker's reported capacity
    (``WorkerSnapshot.kv_capacity_blocks``), else the nominal model's
    ``StepTimeModel.kv_capacity_blocks(block size)``.

    Approximations:

    - The global radix tree is one :class:`RoutedPrefixIndex` per GPU, mirroring the
      GPU's LRU cache at its KV capacity (``kv_capacity_blocks``) — Preble's tree is
      kept in step with the GPUs' evictions. Hashes are inserted root-last so that
      the LRU trim drops the deepest blocks first, like radix-tree leaf eviction.
      Matches are in whole blocks (× block size, capped at the input length).
    - Times come from the router's nominal step-time model (``ctx.step_models``),
      not Preble's fitted prefill curve and measured TPOT; the decode time is fixed
      when the request is routed (Preble multiplies the current TPOT by the number
      of the prefix's active requests).
    - Eviction: free blocks = capacity − ``kv_usage`` × capacity − ``idle_cached_blocks``;
      evicted blocks = min(idle, max(0, ceil(missed / block size) − free)) — the
      request's new prompt KV, not its output (Preble's ``virtual_evict_for_routing``
      also evicts the new prompt tokens). The hit frequency of the evicted blocks is
      approximated by GPU i's mean windowed hits per remembered block: Σ hit blocks
      of its windowed requests / blocks in its tree (Preble: windowed hit count ×
      miss rate of each evicted tree node). Evicted blocks are recomputed without
      context.
    - Preble's load rebalancing (prefix replication when one GPU's load exceeds 15×
      another's, ``handle_important_node_stealing``) and its post-assignment
      prefill/decode balancing inside a GPU are not modelled.
    - Candidates are all workers: kvcost's hot-spot skew limit (``ctx.allowed``)
      is not part of Preble.

    Args:
        window_s: > 0 seconds.
        expected_output_tokens: ≥ 0 tokens.
        kv_capacity_blocks: ≥ 1 blocks per GPU, or None for the nominal capacity.
        seed: unused (Preble breaks no tie at random); accepted like every policy's.

    Raises:
        ValueError: an argument out of range (the message names it).

    Thread safety: not thread-safe (the window and trees change on every decision).
    """

    name = "preble_e2"

    def __init__(
        self,
        *,
        window_s: float = DEFAULT_WINDOW_S,
        expected_output_tokens: int = DEFAULT_EXPECTED_OUTPUT_TOKENS,
        kv_capacity_blocks: int | None = None,
        seed: int = DEFAULT_SEED,
    ) -> None:
        super().__init__(seed=seed)
        if not window_s > 0:
            raise ValueError(f"window_s = {window_s}, expected > 0")
        if expected_output_tokens < 0:
            raise ValueError(f"expected_output_tokens = {expected_output_tokens}, expected ≥ 0")
        if kv_capacity_blocks is not None and kv_capacity_blocks < 1:
            raise ValueError(f"kv_capacity_blocks = {kv_capacity_blocks}, expected ≥ 1 or None")
        self.window_s = window_s
        self.expected_output_tokens = expected_output_tokens
        self.kv_capacity_blocks = kv_capacity_blocks
        self.trees: dict[int, RoutedPrefixIndex] = {}
        self._window: deque[_Routed] = deque()

    def _capacity_blocks(self, snapshot: WorkerSnapshot, step_model: StepTimeModel, block_size_tokens: int) -> int:
        if self.kv_capacity_blocks is not None:
            return self.kv_capacity_blocks
        if snapshot.kv_capacity_blocks:
            return snapshot.kv_capacity_blocks
        return step_model.kv_capacity_blocks(block_size_tokens)

    def _expire(self, now_s: float) -> None:
        start_s = now_s - self.window_s
        while self._window and self._window[0].time_s < start_s:
            self._window.popleft()

    def matched_tokens(self, ctx: PolicyContext) -> np.ndarray:
        """Prefix each candidate holds per the global tree, tokens, int64 ``(n,)`` (≤ input tokens)."""
        request = ctx.request
        blocks = [
            self.trees[s.worker_id].match(request.block_hashes, [s.worker_id])[0] if s.worker_id in self.trees else 0
            for s in ctx.snapshots
        ]
        return np.minimum(np.array(blocks, dtype=np.int64) * request.namespace.block_size_tokens, request.input_tokens)

    def costs(self, ctx: PolicyContext) -> PrebleCosts:
        """The E2 cost terms for every candidate over the window as it stands (``choose`` expires it first).

        Raises:
            ValueError: ``kv_capacity_blocks`` is None and a GPU type's nominal model has no KV room.
        """
        request = ctx.request
        block_size = request.namespace.block_size_tokens
        matched = self.matched_tokens(ctx)
        load_s = {s.worker_id: 0.0 for s in ctx.snapshots}
        hits = {s.worker_id: 0 for s in ctx.snapshots}
        for routed in self._window:
            if routed.worker_id in load_s:
                load_s[routed.worker_id] += routed.work_s
                hits[routed.worker_id] += routed.hit_blocks
        prefill_s, eviction_s = [], []
        for snapshot, cached in zip(ctx.snapshots, matched.tolist(), strict=True):
            step_model = ctx.step_models[snapshot.gpu]
            missed = request.input_tokens - cached
            prefill_s.append(step_model.prefill_alone_s(missed, cached))
            capacity = self._capacity_blocks(snapshot, step_model, block_size)
            free = max(0, capacity - round(snapshot.kv_usage * capacity) - snapshot.idle_cached_blocks)
            evicted = min(snapshot.idle_cached_blocks, max(0, math.ceil(missed / block_size) - free))
            tree = self.trees.get(snapshot.worker_id)
            remembered = tree.size_blocks(snapshot.worker_id) if tree is not None else 0
            hit_rate = hits[snapshot.worker_id] / remembered if remembered else 0.0
            eviction_s.append(step_model.prefill_alone_s(evicted * block_size) * hit_rate if evicted else 0.0)
        load = np.array([load_s[s.worker_id] for s in ctx.snapshots])
        prefill = np.array(prefill_s)
        eviction = np.array(eviction_s)
        cost = load + prefill + eviction
        return PrebleCosts(matched_tokens=matched, load_s=load, prefill_s=prefill, eviction_s=eviction, cost_s=cost)

    def choose(self, ctx: PolicyContext) -> tuple[int, str]:
        """Exploit (lowest cost among the GPUs holding the longest prefix) or explore (lowest cost overall)."""
        self._expire(ctx.now_s)
        costs = self.costs(ctx)
        matched = costs.matched_tokens
        cached = int(matched.max())
        missed = ctx.request.input_tokens - cached
        if missed < cached:
            candidates = np.flatnonzero(matched == cached)
            branch = f"exploit: missed {missed} < cached {cached} tokens"
        else:
            candidates = np.arange(len(ctx.snapshots))
            branch = f"explore: missed {missed} ≥ cached {cached} tokens"
        index = int(candidates[np.argmin(costs.cost_s[candidates])])
        among = f"among {len(candidates)} holder(s)" if missed < cached else f"among {len(candidates)}"
        return index, (
            f"{branch}; lowest cost {among} → worker {ctx.snapshots[index].worker_id}: "
            f"{costs.cost_s[index] * 1e3:.3f} ms = load {costs.load_s[index] * 1e3:.3f} + "
            f"prefill {costs.prefill_s[index] * 1e3:.3f} + eviction {costs.eviction_s[index] * 1e3:.3f}"
        )

    def on_routed(self, ctx: PolicyContext, index: int) -> None:
        """Add the request to the window and to the chosen GPU's tree (LRU-trimmed to its KV capacity)."""
        request = ctx.request
        snapshot = ctx.snapshots[index]
        step_model = ctx.step_models[snapshot.gpu]
        block_size = request.namespace.block_size_tokens
        cached = int(self.matched_tokens(ctx)[index])
        work_s = step_model.prefill_alone_s(request.input_tokens - cached, cached)
        work_s += self.expected_output_tokens * decode_step_s(step_model, snapshot, request.input_tokens)
        self._window.append(_Routed(ctx.now_s, snapshot.worker_id, work_s, cached // block_size))
        tree = self.trees.setdefault(snapshot.worker_id, RoutedPrefixIndex())
        tree.insert(snapshot.worker_id, request.block_hashes, ctx.now_s)
        tree.trim(self._capacity_blocks(snapshot, step_model, block_size))
