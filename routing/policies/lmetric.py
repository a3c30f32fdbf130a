"""The ``lmetric`` anchor: LMetric's product of uncached prefill and decode batch (kvcost issue 13, §2).

Source: LMetric (OSDI 2026), also shipped as the ``lmetric`` worker selector of
NVIDIA Dynamo's KV router. The rule as the issue states it: route to the argmin
of *uncached prefill tokens × (running decode batch + 1)*: the prefill the
request still has to compute on a worker, scaled by how many decodes it would
be interleaved with there.

Unverified: neither the paper's text nor Dynamo's selector source could be found
in the sources searched when this was written, so the rule follows the issue's
statement; in particular whether
the factor counts the worker's already queued prefill tokens as well is not
checked (here it does not: the request's own uncached tokens only), nor how
ties are broken (here uniformly at random, as Dynamo's default selector does).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvcost.routing.policies.base import DEFAULT_SEED, ROUTER_POLICIES, PolicyContext, RouterPolicy, random_among_ties


@dataclass(frozen=True, slots=True)
class LMetricScores:
    """Per-candidate terms of the metric, shape ``(n,)``.

    Attributes:
        uncached_tokens: int64, ``input_tokens − reusable_tokens``.
        decode_batch: int64, the candidate's running decode requests.
        metric: float64, ``uncached_tokens × (decode_batch + 1)``.
    """

    uncached_tokens: np.ndarray
    decode_batch: np.ndarray
    metric: np.ndarray


def lmetric_scores(ctx: PolicyContext) -> LMetricScores:
    """The metric of every candidate (uncached from the directory's reusable prefix, ``ctx.reusable_tokens``)."""
    uncached = np.int64(ctx.request.input_tokens) - np.asarray(ctx.reusable_tokens, dtype=np.int64)
    batch = np.array([s.running_requests for s in ctx.snapshots], dtype=np.int64)
    return LMetricScores(uncached, batch, uncached.astype(np.float64) * (batch + 1))


@ROUTER_POLICIES.register("lmetric")
class LMetricPolicy(RouterPolicy):
    """LMetric: lowest ``uncached prefill tokens × (running decode batch + 1)``; random among ties (seeded).

    Approximations (besides the unverified points of the module docstring):

    - The uncached tokens come from kvcost's event-fed directory (reusable prefix in
      any tier counts as cached), not from Dynamo's own indexer.
    - The running decode batch is the snapshot's requests in decode; requests still in
      (chunked) prefill are not counted.
    - Candidates are all workers: kvcost's hot-spot skew limit (``ctx.allowed``) is not part of LMetric.

    Args:
        seed: seed of the tie-break generator.
    """

    name = "lmetric"

    def __init__(self, *, seed: int = DEFAULT_SEED) -> None:
        super().__init__(seed=seed)
        self._rng = np.random.default_rng(seed)

    def choose(self, ctx: PolicyContext) -> tuple[int, str]:
        """Smallest metric; uniform random among ties."""
        scores = lmetric_scores(ctx)
        index, tied = random_among_ties(scores.metric, self._rng)
        how = "min LMetric" if tied == 1 else f"min LMetric (random among {tied} tied)"
        reason = (
            f"{how} {scores.metric[index]:.0f} = {scores.uncached_tokens[index]} uncached tokens "
            f"× ({scores.decode_batch[index]} decoding + 1)"
        )
        return index, reason
