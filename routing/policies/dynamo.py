"""The ``dynamo_kv`` baseline: NVIDIA Dynamo's KV-aware router (docs/architecture.md §7).

Source: ai-dynamo/dynamo, read on ``main``:

- ``lib/kv-router/src/scheduling/selector/default.rs``: ``worker_logit`` (the
  cost), ``minimum_cost_index`` and the zero-temperature branch of
  ``pick_default_worker`` (uniform random tie-break), ``softmax_sample_index``
  (sampling at temperature > 0).
- ``lib/kv-router/src/scheduling/selector/mod.rs``: ``WorkerSelectionInput::row``
  (``raw_prefill_blocks`` = (active prefill tokens + uncached + cached tokens) / block size).
- ``lib/kv-router/src/sequences/`` (``WorkerLoadProjection::potential_decode_blocks``
  = active blocks + the request's blocks not already active on the worker).
- ``lib/kv-router/src/scheduling/config.rs``: ``KvRouterConfig::default`` (the defaults below).

Older releases (``lib/llm/src/kv_router/scheduler.rs``) used the two-term logit
``overlap_score_weight × prefill_blocks + decode_blocks``; the deprecated
``overlap_score_weight`` / ``--kv-overlap-score-weight`` now maps to
``prefill_load_scale``, and broke cost ties by the smaller radix tree before
choosing at random.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvcost.core.types import WorkerSnapshot
from kvcost.routing.policies.base import ROUTER_POLICIES, PolicyContext, RouterPolicy, random_among_ties

#: Credit per GPU (device) overlap block; ``overlap_score_credit`` in config.rs (valid range [0, 1]).
DEFAULT_OVERLAP_SCORE_CREDIT = 1.0
#: Scale of the overlap-adjusted prefill blocks; ``prefill_load_scale`` in config.rs (≥ 0).
DEFAULT_PREFILL_LOAD_SCALE = 1.0
#: Credit per host-memory (CPU) hit block; ``host_cache_hit_weight`` in config.rs.
DEFAULT_HOST_CACHE_HIT_WEIGHT = 0.75
#: Credit per disk hit block; ``disk_cache_hit_weight`` in config.rs.
DEFAULT_DISK_CACHE_HIT_WEIGHT = 0.25
#: Credit per shared-store (remote) hit block; ``shared_cache_multiplier`` in config.rs
#: (0 = off; Dynamo's CLI sets 0.5 when a shared cache is configured).
DEFAULT_SHARED_CACHE_MULTIPLIER = 0.0
#: Softmax temperature; ``router_temperature`` in config.rs (0 = deterministic lowest cost).
DEFAULT_ROUTER_TEMPERATURE = 0.0
#: Seed of the policy's own generator for tie-breaks and sampling (kvcost's choice: Dynamo
#: draws from an unseeded ``fastrand``; a fixed seed keeps replays reproducible).
DEFAULT_SEED = 0


@dataclass(frozen=True, slots=True)
class DynamoCosts:
    """Per-candidate terms of Dynamo's cost, all in blocks, shape ``(n,)`` float64.

    ``cost_blocks = prefill_load_scale × max(raw_prefill_blocks − overlap_credit_blocks, 0) + decode_blocks``.
    """

    raw_prefill_blocks: np.ndarray
    overlap_credit_blocks: np.ndarray
    decode_blocks: np.ndarray
    cost_blocks: np.ndarray


def active_prefill_tokens(snapshot: WorkerSnapshot) -> int:
    """Prompt tokens not yet prefilled on the worker (Dynamo's ``active_prefill_tokens``)."""
    return snapshot.queued_prefill_tokens


def active_blocks(snapshot: WorkerSnapshot, block_size_tokens: int) -> int:
    """KV blocks held by the worker's live requests (Dynamo's ``active_decode_blocks``).

    Dynamo counts a request's blocks from routing until it finishes, whether it
    is still in prefill or decoding: ceil((remaining + context) / block size) per
    waiting request plus ceil(decode_context_tokens / block size) for the decode
    batch (only its total is known).
    """
    waiting = sum(
        math.ceil((remaining + context) / block_size_tokens) for remaining, context in snapshot.waiting_prefill
    )
    return waiting + math.ceil(snapshot.decode_context_tokens / block_size_tokens)


def softmax_probabilities(cost_blocks: np.ndarray, temperature: float) -> np.ndarray:
    """Dynamo's selection probabilities over costs, shape ``(n,)``, summing to 1.

    Costs are normalised by their range and negated: ``p_i ∝ exp(−(c_i − min c) /
    ((max c − min c) × temperature))``; uniform when all costs are equal
    (``softmax_sample_index`` in default.rs).

    Raises:
        ValueError: ``temperature`` ≤ 0.
    """
    if not temperature > 0:
        raise ValueError(f"temperature = {temperature}, expected > 0 (0 means argmin, no sampling)")
    costs = np.asarray(cost_blocks, dtype=np.float64)
    low, high = costs.min(), costs.max()
    if low == high:
        return np.full(costs.shape, 1.0 / costs.size)
    weights = np.exp(-(costs - low) / ((high - low) * temperature))
    return weights / weights.sum()


def _check_unit(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} = {value}, expected a value in [0, 1]")


@ROUTER_POLICIES.register("dynamo_kv")
class DynamoKvPolicy(RouterPolicy):
    """NVIDIA Dynamo KV router: lowest overlap-credited block cost (ai-dynamo/dynamo, see module docstring).

    Rule, per candidate i (block size B = ``request.namespace.block_size_tokens``)::

        raw_prefill_blocks_i = (active prefill tokens_i + input_tokens) / B        (fractional)
        overlap_credit_i     = w(tier_i) × reusable_blocks_i
        decode_blocks_i      = active blocks_i + ceil(input_tokens / B)
        cost_i = prefill_load_scale × max(raw_prefill_blocks_i − overlap_credit_i, 0) + decode_blocks_i

    with w = ``overlap_score_credit`` (gpu), ``host_cache_hit_weight`` (cpu),
    ``disk_cache_hit_weight`` (disk), ``shared_cache_multiplier`` (remote).
    At ``router_temperature`` 0 the lowest cost wins, ties broken uniformly at
    random; above 0 a candidate is sampled with :func:`softmax_probabilities`.

    Defaults (``KvRouterConfig::default`` in config.rs): overlap_score_credit 1.0,
    prefill_load_scale 1.0, host_cache_hit_weight 0.75, disk_cache_hit_weight
    0.25, shared_cache_multiplier 0.0, router_temperature 0.0. Knobs at 0 by
    default and left out: ``overlap_score_credit_decay`` and
    ``decode_active_request_weight``. ``seed``: :data:`DEFAULT_SEED`.

    Approximations (the router sees a snapshot, not Dynamo's own request tracking):

    - Active prefill tokens = the snapshot's remaining prefill tokens (Dynamo
      holds a request's full uncached prompt until its prefill completes).
    - Active blocks = blocks of every request not finished (see
      :func:`active_blocks`); Dynamo deduplicates blocks shared between active
      sequences (``router_assume_kv_reuse``) and, by default, does not count
      generated tokens, whereas ``decode_context_tokens`` includes them.
    - The request's new active blocks are all ``ceil(input / B)`` blocks (no
      dedup against the worker's active sequences).
    - The directory reports one tier per match (the deepest block's), so all
      reusable blocks get that tier's weight; Dynamo counts device, host and
      disk blocks of one match separately.
    - Candidates are all workers: kvcost's hot-spot skew limit (``ctx.allowed``)
      is not part of Dynamo.
    - No router-side queue: with ``router_queue_threshold`` (default 16.0) Dynamo
      parks a request while every worker's active tokens exceed 16 ×
      ``max_num_batched_tokens`` and routes it, FCFS, when one drops below; here
      every request is routed on arrival (the replay's policies have no deferral
      hook). It can matter only when every worker is that far behind, i.e. in the
      95 % load cells of ``kvcost bench``, where late binding could lower
      Dynamo's tail TTFT.

    Args:
        overlap_score_credit, host_cache_hit_weight, disk_cache_hit_weight,
            shared_cache_multiplier: credit per overlap block by tier, each in [0, 1].
        prefill_load_scale: ≥ 0.
        router_temperature: ≥ 0.
        seed: seed of the policy's ``numpy.random.Generator``.

    Raises:
        ValueError: a weight out of range (the message names it).
    """

    name = "dynamo_kv"

    def __init__(
        self,
        *,
        overlap_score_credit: float = DEFAULT_OVERLAP_SCORE_CREDIT,
        prefill_load_scale: float = DEFAULT_PREFILL_LOAD_SCALE,
        host_cache_hit_weight: float = DEFAULT_HOST_CACHE_HIT_WEIGHT,
        disk_cache_hit_weight: float = DEFAULT_DISK_CACHE_HIT_WEIGHT,
        shared_cache_multiplier: float = DEFAULT_SHARED_CACHE_MULTIPLIER,
        router_temperature: float = DEFAULT_ROUTER_TEMPERATURE,
        seed: int = DEFAULT_SEED,
    ) -> None:
        _check_unit("overlap_score_credit", overlap_score_credit)
        _check_unit("host_cache_hit_weight", host_cache_hit_weight)
        _check_unit("disk_cache_hit_weight", disk_cache_hit_weight)
        _check_unit("shared_cache_multiplier", shared_cache_multiplier)
        if not prefill_load_scale >= 0:
            raise ValueError(f"prefill_load_scale = {prefill_load_scale}, expected ≥ 0")
        if not router_temperature >= 0:
            raise ValueError(f"router_temperature = {router_temperature}, expected ≥ 0")
        self.prefill_load_scale = prefill_load_scale
        self.router_temperature = router_temperature
        self.tier_credit = {
            "none": 0.0,
            "gpu": overlap_score_credit,
            "cpu": host_cache_hit_weight,
            "disk": disk_cache_hit_weight,
            "remote": shared_cache_multiplier,
        }
        super().__init__(seed=seed)
        self._rng = np.random.default_rng(seed)

    def costs(self, ctx: PolicyContext) -> DynamoCosts:
        """Dynamo's cost terms for every candidate.

        Raises:
            ValueError: ``ctx.matches`` does not have one match per candidate.
        """
        if len(ctx.matches) != len(ctx.snapshots):
            raise ValueError(
                f"dynamo_kv needs one directory match per candidate: {len(ctx.matches)} matches, "
                f"{len(ctx.snapshots)} candidates"
            )
        block_size = ctx.request.namespace.block_size_tokens
        input_tokens = ctx.request.input_tokens
        request_blocks = math.ceil(input_tokens / block_size)
        raw = np.array([(active_prefill_tokens(s) + input_tokens) / block_size for s in ctx.snapshots])
        credit = np.array([self.tier_credit[m.tier] * m.reusable_blocks for m in ctx.matches])
        decode = np.array([active_blocks(s, block_size) + request_blocks for s in ctx.snapshots], dtype=np.float64)
        cost = self.prefill_load_scale * np.maximum(raw - credit, 0.0) + decode
        return DynamoCosts(raw_prefill_blocks=raw, overlap_credit_blocks=credit, decode_blocks=decode, cost_blocks=cost)

    def choose(self, ctx: PolicyContext) -> tuple[int, str]:
        """Lowest cost (random among ties) at temperature 0, else a softmax sample."""
        costs = self.costs(ctx)
        cost = costs.cost_blocks
        if self.router_temperature == 0:
            index, tied = random_among_ties(cost, self._rng)
            how = "lowest cost" if tied == 1 else f"lowest cost (random among {tied} tied)"
        else:
            probabilities = softmax_probabilities(cost, self.router_temperature)
            cumulative = np.cumsum(probabilities)
            index = min(int(np.searchsorted(cumulative, self._rng.random(), side="left")), cost.size - 1)
            how = f"sampled at temperature {self.router_temperature:g} (p={probabilities[index]:.2f})"
        match = ctx.matches[index]
        reason = (
            f"{how} {cost[index]:.2f} blocks = {self.prefill_load_scale:g} × "
            f"max({costs.raw_prefill_blocks[index]:.2f} − {costs.overlap_credit_blocks[index]:.2f}, 0) "
            f"+ {costs.decode_blocks[index]:.0f}; overlap {match.reusable_blocks} {match.tier} blocks"
        )
        return index, reason
