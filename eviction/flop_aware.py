"""``flop_aware``: Marconi's eviction utility (Pan et al., "Marconi: Prefix caching for the era of
hybrid LLMs", MLSys 2025, §4.2, Eq. 1–2)."""

from __future__ import annotations

import numpy as np

from kvcost.eviction.base import EVICTION_POLICIES, EvictionPolicy, NodeTable, base_terms


def _bounds(x: np.ndarray) -> tuple[float, float]:
    return (float(x.min()), float(x.max())) if len(x) else (0.0, 0.0)


def _normalise(x: np.ndarray, bounds: tuple[float, float]) -> np.ndarray:
    """Min-max scale to [0, 1] with ``bounds`` (all 0 when they are equal), clipped."""
    lo, hi = bounds
    return np.clip((x - lo) / (hi - lo), 0.0, 1.0) if hi > lo else np.zeros_like(x, dtype=np.float64)


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

    def __init__(self, context) -> None:
        super().__init__(context)
        self._scales: tuple[tuple[float, float], tuple[float, float]] | None = None

    def terms(self, nodes: NodeTable, now_s: float) -> dict[str, np.ndarray]:
        """Normalised over ``nodes`` (all candidates); the bounds are kept for :meth:`score_new`."""
        recency, efficiency = nodes.last_access_s.astype(np.float64), nodes.flops_saved / nodes.size_bytes
        self._scales = (_bounds(recency), _bounds(efficiency))
        return base_terms(nodes, self._utility(recency, efficiency))

    def score_new(self, nodes: NodeTable, now_s: float) -> np.ndarray:
        """Blocks turning idle between re-ranks: normalised with the last re-rank's bounds (recency clips at 1)."""
        if self._scales is None:
            return self.terms(nodes, now_s)["value"]
        return self._utility(nodes.last_access_s.astype(np.float64), nodes.flops_saved / nodes.size_bytes)

    def _utility(self, recency: np.ndarray, efficiency: np.ndarray) -> np.ndarray:
        scale_r, scale_e = self._scales
        return _normalise(recency, scale_r) + self.context.flop_alpha * _normalise(efficiency, scale_e)
