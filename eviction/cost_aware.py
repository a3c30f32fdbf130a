"""``cost_aware``: kvcost's value = P(reuse within H) × prefill seconds lost by evicting ÷ bytes held
(docs/architecture.md §5)."""

from __future__ import annotations

import numpy as np

from kvcost.eviction.base import EVICTION_POLICIES, EvictionPolicy, NodeTable, base_terms, recency_prior


def seconds_lost(prefill_saved_s: np.ndarray, restore_s: np.ndarray) -> np.ndarray:
    """The "minus restore cost" rule: evicting loses min(prefill saved, restore) seconds, float64 ``(n,)``.

    A block that can be demoted to a lower tier (CPU, disk) instead of dropped
    can come back in ``restore_s``; a later hit then pays the restore rather
    than the prefill, so at most ``restore_s`` is lost. ``restore_s`` = inf
    (drop only) leaves the full prefill saved.
    """
    return np.minimum(prefill_saved_s, restore_s)


@EVICTION_POLICIES.register("cost_aware")
class CostAwarePolicy(EvictionPolicy):
    """value = P(reuse within H) × min(prefill_saved_s, restore_s) / size_bytes (seconds per byte).

    P(reuse) comes from ``context.reuse_model``: a
    :class:`~kvcost.models.reuse_cure.CureReuseModel` (a mixture cure survival
    model of the gap to the next use, the eviction study's default) or a
    :class:`~kvcost.models.reuse.ReuseClassifier` (LightGBM on the block's
    history, :data:`~kvcost.features.spec.EVICTION_FEATURE_SPEC`), or, without
    one, :func:`~kvcost.eviction.base.recency_prior`.
    Formula: docs/architecture.md §5 and issue 6 (value per byte, as in size-aware caching,
    e.g. GreedyDual-Size, Cao and Irani, USITS 1997, without its ageing term).
    ``prefill_saved_s`` comes from the router's own prefill predictor (see
    :mod:`kvcost.eviction.prefill`). P(reuse) decays with idle time,
    so the index re-ranks every ``rerank_interval_s`` (``time_varying``).
    """

    name = "cost_aware"
    time_varying = True
    uses_reuse_model = True

    def terms(self, nodes: NodeTable, now_s: float) -> dict[str, np.ndarray]:
        model = self.context.reuse_model
        if model is None:
            p_reuse = recency_prior(nodes, now_s, self.context.horizon_s)
        else:
            p_reuse = np.asarray(model.predict_proba(nodes, now_s), dtype=np.float64)
        lost_s = seconds_lost(nodes.prefill_saved_s.astype(np.float64), nodes.restore_s.astype(np.float64))
        return base_terms(nodes, p_reuse * lost_s / nodes.size_bytes, p_reuse)
