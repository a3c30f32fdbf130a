"""``clairvoyant``: an offline reference that reads the trace's future arrivals (not deployable).

An eviction study that only compares online policies cannot say how much any online rule could
still gain. This policy knows, for every block, when the next request that carries it arrives
(anywhere in the fleet) and keeps the blocks whose recompute is dearest per byte per second until
that arrival. It gives the study a ceiling: the prefill seconds an online P(reuse) could at best
recover. It is offline by construction; the service never offers it
(:func:`~kvcost.eviction.base.deployable_policies`).

Why it is a reference and not a proof of optimality: with costs that differ per block, offline
optimal caching is NP-hard in general (Chrobak, Woeginger, Makino and Xu, "Caching is hard – even
in the fault model", Algorithmica 2012), and Belady's farthest-next-use rule (Belady, IBM Systems
Journal 1966) is optimal only for equal costs and sizes. The value used here is the greedy
cost-per-byte-per-second of waiting, the offline counterpart of ``cost_aware``'s P(reuse) ×
seconds ÷ bytes. In a cluster the next use is also not tied to this worker: the router may send
the next carrier elsewhere, so a block kept for it may go unused here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvcost.eviction.base import EVICTION_POLICIES, EvictionPolicy, NodeTable, base_terms

#: Floor of the time to the next use, seconds: a next use due now (or already past, between
#: re-ranks) counts as this close, so the value stays finite.
MIN_GAP_S = 1e-3


class NextUseTable:
    """When each block is next carried by an arriving request: the future a ``clairvoyant`` pool reads.

    Built once per trace from every request's full-block hashes and arrival time. Lookups are
    vectorised: one sort at build time, one ``searchsorted`` per query batch (each block's times lie
    on one sorted line, shifted into a stretch of their own).

    Args:
        arrivals_s: arrival time of each request, seconds, shape ``(r,)``, finite.
        block_hashes: per request, the hashes of its full prompt blocks (the ones a later request can
            hit: a partial last block is never reusable), non-negative integers < 2⁶³.

    Raises:
        ValueError: the two lengths differ, an arrival is not finite, or a hash is negative.
    """

    def __init__(self, arrivals_s: Sequence[float], block_hashes: Sequence[Sequence[int]]) -> None:
        if len(arrivals_s) != len(block_hashes):
            given = f"arrivals_s has {len(arrivals_s)} entries and block_hashes {len(block_hashes)}"
            raise ValueError(f"{given}, expected one per request")
        counts = np.fromiter((len(h) for h in block_hashes), dtype=np.int64, count=len(block_hashes))
        times = np.repeat(np.asarray(arrivals_s, dtype=np.float64), counts)
        hashes = np.fromiter((x for h in block_hashes for x in h), dtype=np.int64, count=int(counts.sum()))
        if not np.all(np.isfinite(times)):
            raise ValueError("arrivals_s contains a non-finite time, expected finite seconds")
        if len(hashes) and hashes.min() < 0:
            raise ValueError(f"block_hashes contains {int(hashes.min())}, expected non-negative integers")
        order = np.lexsort((times, hashes))
        hashes, times = hashes[order], times[order]
        self._keys, group = np.unique(hashes, return_inverse=True)
        self._ends = np.append(np.flatnonzero(np.diff(group)) + 1, len(group)) if len(group) else group
        # one sorted line: block g's times shifted into [g·span, (g+1)·span), searched in one call
        self._t0_s = float(times.min()) if len(times) else 0.0
        self._span_s = float(times.max()) - self._t0_s + 1.0 if len(times) else 1.0
        self._line = group * self._span_s + (times - self._t0_s)
        self._times = times

    def next_use_s(self, block_hashes: np.ndarray, now_s: float) -> np.ndarray:
        """Arrival time of the first request after ``now_s`` that carries each block, float64 ``(n,)``.

        ``inf`` where no later request carries it (or the hash is unknown, e.g. −1).
        """
        block_hashes = np.asarray(block_hashes, dtype=np.int64)
        out = np.full(len(block_hashes), np.inf)
        if not len(self._keys) or not len(block_hashes):
            return out
        group = np.minimum(np.searchsorted(self._keys, block_hashes), len(self._keys) - 1)
        known = self._keys[group] == block_hashes
        now_in_span = min(max(now_s - self._t0_s, -1.0), self._span_s - 0.5)  # stays inside the block's stretch
        at = np.searchsorted(self._line, group * self._span_s + now_in_span, side="right")
        found = known & (at < self._ends[group])
        out[found] = self._times[at[found]]
        return out


@EVICTION_POLICIES.register("clairvoyant")
class ClairvoyantPolicy(EvictionPolicy):
    """value = prefill seconds saved ÷ bytes ÷ seconds until the block's next use (reads the future).

    A block no later request carries has value 0 and goes first (oldest first). Time-varying: the
    gap shrinks as the next use nears, and a next use that passed while the block was idle (the
    carrier was routed elsewhere) is replaced by the one after it at the next re-rank. ``p_reuse``
    is reported as 1 where a next use exists and 0 where none does.

    Raises:
        ValueError: the context has no ``next_use`` table (the policy runs in replays of a known
            trace only, e.g. ``kvcost eviction-study --policies clairvoyant``).
    """

    name = "clairvoyant"
    time_varying = True
    reads_future = True

    def __init__(self, context) -> None:
        super().__init__(context)
        if context.next_use is None:
            raise ValueError(
                "clairvoyant reads the trace's future arrivals: EvictionContext.next_use is None, expected a "
                "NextUseTable (the policy is an offline reference for replays of a known trace: "
                "`kvcost eviction-study`, or `--eviction-policy` of `replay`, `experiment` and `bench`; "
                "it is not deployable)"
            )

    def terms(self, nodes: NodeTable, now_s: float) -> dict[str, np.ndarray]:
        next_s = self.context.next_use.next_use_s(nodes.block_hash, now_s)
        known = np.isfinite(next_s)
        gap_s = np.maximum(np.where(known, next_s - now_s, np.inf), MIN_GAP_S)
        value = nodes.prefill_saved_s / nodes.size_bytes / gap_s
        return base_terms(nodes, value, known.astype(np.float64))
