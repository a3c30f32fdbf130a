"""``flop_aware``: Marconi's eviction utility (Pan et al., "Marconi: Prefix caching for the era of
hybrid LLMs", MLSys 2025, §4.2, Eq. 1–2)."""

from __future__ import annotations

import numpy as np

from kvcost.serving.eviction.base import EVICTION_POLICIES, EvictionPolicy, NodeTable, base_terms


def _normalise(x: np.ndarray) -> np.ndarray:
    """Min-max scale to [0, 1] over the candidates (all 0 when they are equal)."""
    lo, hi = (float(x.min()), float(x.max())) if len(x) else (0.0, 0.0)
    return (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x, dtype=np.float64)


@EVICTION_POLICIES.register("flop_aware")
class FlopAwarePolicy(EvictionPolicy):
    """Utility S = recency + α × FLOP efficiency, both min-max normalised over the candidates.

    recency = ``last_access_s`` (normalised: the most recent candidate 1, the
    oldest 0); FLOP efficiency = ``flops_saved`` / ``size_bytes`` (normalised
    the same way). The lowest S is evicted. α = ``context.flop_alpha``,
    default 1.0: an assumption weighting the two equally. Marconi instead picks
    α by a retrospective grid search over recent requests ("bootstrapping");
    that tuning is not reproduced here. Normalisation depends on the whole
    candidate set, so the index re-ranks (``time_varying``).
    """

    name = "flop_aware"
    time_varying = True

    def terms(self, nodes: NodeTable, now_s: float) -> dict[str, np.ndarray]:
        recency = _normalise(nodes.last_access_s.astype(np.float64))
        efficiency = _normalise(nodes.flops_saved / nodes.size_bytes)
        return base_terms(nodes, recency + self.context.flop_alpha * efficiency)
