"""``gdsf``: GreedyDual-Size-Frequency (Cherkasova, "Improving WWW proxies performance with
Greedy-Dual-Size-Frequency caching policy", HP Labs HPL-98-69, 1998)."""

from __future__ import annotations

import numpy as np

from kvcost.eviction.base import EVICTION_POLICIES, EvictionPolicy, NodeTable, base_terms


@EVICTION_POLICIES.register("gdsf")
class GDSFPolicy(EvictionPolicy):
    """Priority H = L + frequency × cost / size; the lowest H is evicted and L is inflated to it.

    frequency = hits + 1 (accesses including the one that stored the block);
    cost = ``prefill_saved_s`` (the seconds a miss costs to recompute the block);
    size = ``size_bytes``. ``L`` starts at 0 and becomes the priority of each
    evicted block (:meth:`on_evict`), so blocks that have not been touched
    since age out. A block's H is fixed when it turns idle (``time_varying``
    False), as in the paper where H is set on access.
    """

    name = "gdsf"

    def __init__(self, context) -> None:
        super().__init__(context)
        self.inflation = 0.0

    def terms(self, nodes: NodeTable, now_s: float) -> dict[str, np.ndarray]:
        frequency = nodes.hits.astype(np.float64) + 1.0
        value = self.inflation + frequency * nodes.prefill_saved_s / nodes.size_bytes
        return base_terms(nodes, value)

    def on_evict(self, value: float, hits: int, idle_age_s: float) -> None:
        self.inflation = max(self.inflation, value)
