"""The ``llmd_default`` baseline: llm-d's default scheduling profile (docs/architecture.md §7).

Sources (kubernetes-sigs/gateway-api-inference-extension, the endpoint picker llm-d builds on):

- ``config/charts/epplib/templates/_config.yaml``: ``default-plugins.yaml``, profile
  ``default`` = queue-scorer weight 2, kv-cache-utilization-scorer weight 2,
  prefix-cache-scorer weight 3, no picker named (so the default max-score-picker).
- ``pkg/epp/scheduling/framework/plugins/scorer/queue.go``: ``(max − q) / (max − min)``
  over the candidates' waiting queues, 1.0 for every pod when all are equal.
- ``pkg/epp/scheduling/framework/plugins/scorer/kvcache_utilization.go``: ``1 − KVCacheUsagePercent``.
- ``pkg/epp/scheduling/framework/plugins/multi/prefix/plugin.go``: matched blocks /
  request blocks (0 when the prompt has no full block).
- ``pkg/epp/scheduling/framework/scheduler_profile.go``: weighted sum of scores
  clamped to [0, 1] (``enforceScoreRange``).
- ``pkg/epp/scheduling/framework/plugins/picker/max_score_picker.go``: highest total,
  candidates shuffled before a stable sort, i.e. uniform random among ties.

llm-d/llm-d-inference-scheduler ships the same scorers; its sample configs use
other weights (e.g. ``deploy/config/epp-precise-prefix-cache-config.yaml``:
precise-prefix-cache 2, kv-cache-utilization 1, queue 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvcost.routing.policies.base import ROUTER_POLICIES, PolicyContext, RouterPolicy, random_among_ties

#: prefix-cache-scorer weight in the default profile (epplib ``default-plugins.yaml``).
DEFAULT_PREFIX_CACHE_WEIGHT = 3.0
#: queue-scorer weight in the default profile.
DEFAULT_QUEUE_WEIGHT = 2.0
#: kv-cache-utilization-scorer weight in the default profile.
DEFAULT_KV_CACHE_UTILIZATION_WEIGHT = 2.0
#: Seed of the policy's own tie-break generator (kvcost's choice: the picker shuffles with
#: Go's global ``math/rand``; a fixed seed keeps replays reproducible).
DEFAULT_SEED = 0


@dataclass(frozen=True, slots=True)
class LlmdScores:
    """Per-candidate scorer outputs in [0, 1] and their weighted total, shape ``(n,)`` float64."""

    prefix: np.ndarray
    queue: np.ndarray
    kv: np.ndarray
    total: np.ndarray


def queue_scores(waiting_requests: np.ndarray) -> np.ndarray:
    """queue-scorer: ``(max − q) / (max − min)``, all 1.0 when every queue is equal. Shape ``(n,)``."""
    waiting = np.asarray(waiting_requests, dtype=np.float64)
    low, high = waiting.min(), waiting.max()
    if low == high:
        return np.ones_like(waiting)
    return (high - waiting) / (high - low)


@ROUTER_POLICIES.register("llmd_default")
class LlmdDefaultPolicy(RouterPolicy):
    """llm-d default profile: highest weighted sum of prefix-cache, queue and KV-utilisation scores.

    Rule, per candidate pod i::

        prefix_i = reusable_blocks_i / len(request.block_hashes)     (0 if no full block)
        queue_i  = (max_j q_j − q_i) / (max_j q_j − min_j q_j)       (1 if all q equal)
        kv_i     = 1 − kv_usage_i
        score_i  = 3 × prefix_i + 2 × queue_i + 2 × kv_i             (each score clamped to [0, 1])

    The highest score wins; ties are broken uniformly at random (seeded).
    Sources and defaults: see the module docstring (weights 3 / 2 / 2 from
    epplib's ``default-plugins.yaml``); ``seed``: :data:`DEFAULT_SEED`.

    Approximations:

    - The prefix scorer reads the event-fed directory (as llm-d's precise
      prefix scorer does) over the engine's blocks, instead of the default
      scorer's own index of routed prompts hashed in 64-character blocks and
      truncated at ``maxPrefixBlocksToMatch`` (256). llm-d's
      ``precise-prefix-cache-scorer`` would min-max normalise the matched
      block counts instead of dividing by the request's blocks.
    - The waiting queue q (vLLM ``num_requests_waiting``) is the snapshot's
      requests not done with prefill, which includes a request part-way through
      chunked prefill (vLLM counts it as running).
    - Candidates are all workers: kvcost's hot-spot skew limit (``ctx.allowed``)
      is not part of llm-d.

    Args:
        prefix_cache_weight, queue_weight, kv_cache_utilization_weight: scorer weights, ≥ 0.
        seed: seed of the policy's ``numpy.random.Generator``.

    Raises:
        ValueError: a negative weight (the message names it).
    """

    name = "llmd_default"

    def __init__(
        self,
        *,
        prefix_cache_weight: float = DEFAULT_PREFIX_CACHE_WEIGHT,
        queue_weight: float = DEFAULT_QUEUE_WEIGHT,
        kv_cache_utilization_weight: float = DEFAULT_KV_CACHE_UTILIZATION_WEIGHT,
        seed: int = DEFAULT_SEED,
    ) -> None:
        for field, value in (
            ("prefix_cache_weight", prefix_cache_weight),
            ("queue_weight", queue_weight),
            ("kv_cache_utilization_weight", kv_cache_utilization_weight),
        ):
            if not value >= 0:
                raise ValueError(f"{field} = {value}, expected ≥ 0")
        self.prefix_cache_weight = prefix_cache_weight
        self.queue_weight = queue_weight
        self.kv_cache_utilization_weight = kv_cache_utilization_weight
        super().__init__(seed=seed)
        self._rng = np.random.default_rng(seed)

    def scores(self, ctx: PolicyContext) -> LlmdScores:
        """The three scorer outputs and the weighted total for every candidate.

        Raises:
            ValueError: ``ctx.matches`` does not have one match per candidate.
        """
        if len(ctx.matches) != len(ctx.snapshots):
            raise ValueError(
                f"llmd_default needs one directory match per candidate: {len(ctx.matches)} matches, "
                f"{len(ctx.snapshots)} candidates"
            )
        total_blocks = len(ctx.request.block_hashes)
        matched = np.array([m.reusable_blocks for m in ctx.matches], dtype=np.float64)
        prefix = matched / total_blocks if total_blocks else np.zeros_like(matched)
        queue = queue_scores(np.array([s.waiting_requests for s in ctx.snapshots]))
        kv = 1.0 - np.array([s.kv_usage for s in ctx.snapshots], dtype=np.float64)
        prefix, queue, kv = (np.clip(score, 0.0, 1.0) for score in (prefix, queue, kv))
        total = self.prefix_cache_weight * prefix + self.queue_weight * queue + self.kv_cache_utilization_weight * kv
        return LlmdScores(prefix=prefix, queue=queue, kv=kv, total=total)

    def choose(self, ctx: PolicyContext) -> tuple[int, str]:
        """Highest weighted score; uniform random among ties."""
        scores = self.scores(ctx)
        index, tied = random_among_ties(-scores.total, self._rng)
        how = "max score" if tied == 1 else f"max score (random among {tied} tied)"
        snapshot = ctx.snapshots[index]
        reason = (
            f"{how} {scores.total[index]:.3f} = {self.prefix_cache_weight:g}×prefix {scores.prefix[index]:.3f} "
            f"+ {self.queue_weight:g}×queue {scores.queue[index]:.3f} "
            f"+ {self.kv_cache_utilization_weight:g}×kv {scores.kv[index]:.3f}; "
            f"matched {ctx.matches[index].reusable_blocks}/{len(ctx.request.block_hashes)} blocks, "
            f"{snapshot.waiting_requests} waiting, KV usage {snapshot.kv_usage:.2f}"
        )
        return index, reason
