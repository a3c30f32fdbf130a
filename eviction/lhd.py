"""``lhd``: Least Hit Density (Beckmann, Chen and Cidon, "LHD: Improving cache hit rate by
maximizing hit density", NSDI 2018)."""

from __future__ import annotations

import numpy as np

from kvcost.eviction.base import EVICTION_POLICIES, EvictionContext, EvictionPolicy, NodeTable, base_terms

#: Upper edges of the idle-age classes, seconds: 0.5 s, 1 s, 2 s … 2^15 s (≈ 9 h), then one open class.
AGE_EDGES_S: np.ndarray = 2.0 ** np.arange(-1, 16)
#: Representative age of each class (geometric middle; the open class uses twice the last edge).
_AGE_MID_S: np.ndarray = np.concatenate([[0.25], np.sqrt(AGE_EDGES_S[:-1] * AGE_EDGES_S[1:]), [2 * AGE_EDGES_S[-1]]])
#: Prior count per (class, age) cell for hits and for evictions (one pseudo-observation each).
PRIOR_COUNT = 1.0


@EVICTION_POLICIES.register("lhd")
class LHDPolicy(EvictionPolicy):
    """Hit density = expected hits / (size × expected remaining space-time), per age class.

    LHD §3: for an object of age a, HD(a) = Σ_{x ≥ a} P_hit(x) / (S × Σ_{x ≥ a} (x − a) P_end(x)),
    where P_hit(x) and P_end(x) are the probabilities that a lifetime ends in a
    hit, or ends at all (hit or eviction), at age x. Ages here are idle time
    (since the block was released), in log-spaced classes
    (:data:`AGE_EDGES_S`); objects are split in two classes, never hit
    (``hits`` = 0) and hit before, as LHD conditions on reference history.
    Counts start at :data:`PRIOR_COUNT` per cell and grow with each hit
    (:meth:`on_hit`) and eviction (:meth:`on_evict`); LHD's periodic decay of
    the counts is omitted (the replays are stationary enough). Values change
    with age, so the index re-ranks (``time_varying``).
    """

    name = "lhd"
    time_varying = True

    def __init__(self, context: EvictionContext) -> None:
        super().__init__(context)
        n_ages = len(_AGE_MID_S)
        self.hit_counts = np.full((2, n_ages), PRIOR_COUNT)
        self.end_counts = np.full((2, n_ages), 2 * PRIOR_COUNT)

    def terms(self, nodes: NodeTable, now_s: float) -> dict[str, np.ndarray]:
        age_s = np.maximum(0.0, now_s - nodes.last_access_s)
        cls = (nodes.hits > 0).astype(np.int64)
        bins = np.searchsorted(AGE_EDGES_S, age_s)
        density = self._density_table()
        hits_ahead = density[0][cls, bins]
        spacetime = nodes.size_bytes * np.maximum(density[1][cls, bins] - age_s * density[2][cls, bins], 1e-9)
        return base_terms(nodes, hits_ahead / spacetime)

    def _density_table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per (class, age bin): Σ hits, Σ x·ends and Σ ends over ages ≥ the bin (reverse cumulative sums)."""

        def tail(a: np.ndarray) -> np.ndarray:
            return np.cumsum(a[:, ::-1], axis=1)[:, ::-1]

        return tail(self.hit_counts), tail(self.end_counts * _AGE_MID_S), tail(self.end_counts)

    def on_hit(self, hits: int, idle_age_s: float) -> None:
        cls, age = int(hits > 0), int(np.searchsorted(AGE_EDGES_S, idle_age_s))
        self.hit_counts[cls, age] += 1
        self.end_counts[cls, age] += 1

    def on_evict(self, value: float, hits: int, idle_age_s: float) -> None:
        self.end_counts[int(hits > 0), int(np.searchsorted(AGE_EDGES_S, idle_age_s))] += 1
