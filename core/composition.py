"""Composition of the TTFT terms along the critical path (docs/architecture.md §1).

T_i ≈ Q_i + L_i + X_i + P_i + F_i holds only for a serial path. A KV transfer
(X) runs while the request waits in the queue (Q), so the two overlap and the
critical path is ``max(Q, X) + L + P + F``. With no transfer (X = 0) both
forms agree. This module is the one place where terms are composed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: Term names in docs/architecture.md order; log columns are ``pred_<term>_s`` / ``actual_<term>_s``.
TERMS: tuple[str, ...] = ("queue", "lookup", "transfer", "prefill", "first_token")


def compose_ttft_s(queue_s, lookup_s, transfer_s, prefill_s, first_token_s, *, transfer_overlaps_queue=True):
    """Compose TTFT from its terms on the critical path.

    Args:
        queue_s, lookup_s, transfer_s, prefill_s, first_token_s: seconds, scalars or
            arrays of one shape ``(n_candidates,)``; all must be ≥ 0.
        transfer_overlaps_queue: True when the transfer starts at arrival and runs
            while the request queues (``max(Q, X)``); False for a serial path.

    Returns:
        TTFT in seconds, same shape as the inputs (float for scalar inputs).
    """
    if transfer_overlaps_queue:
        head = np.maximum(queue_s, transfer_s)
    else:
        head = np.add(queue_s, transfer_s)
    total = head + lookup_s + prefill_s + first_token_s
    return float(total) if np.ndim(total) == 0 else total


@dataclass(frozen=True, slots=True)
class TermPredictions:
    """Predicted terms for a set of candidates, each ``float64`` of shape ``(n_candidates,)``, in seconds.

    ``ttft_s`` (not an argument) is their composition on the critical path (:func:`compose_ttft_s`),
    computed once at construction: the terms must not be changed in place afterwards.
    """

    queue_s: np.ndarray
    lookup_s: np.ndarray
    transfer_s: np.ndarray
    prefill_s: np.ndarray
    first_token_s: np.ndarray
    ttft_s: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ttft_s = compose_ttft_s(self.queue_s, self.lookup_s, self.transfer_s, self.prefill_s, self.first_token_s)
        object.__setattr__(self, "ttft_s", ttft_s)

    def take(self, index: np.ndarray) -> TermPredictions:
        """The predictions of the rows ``index`` (int array), in that order."""
        return TermPredictions(
            self.queue_s[index],
            self.lookup_s[index],
            self.transfer_s[index],
            self.prefill_s[index],
            self.first_token_s[index],
        )

    def as_matrix(self) -> np.ndarray:
        """Shape ``(n_candidates, 6)``: the five terms in :data:`TERMS` order then TTFT."""
        return np.column_stack(
            [self.queue_s, self.lookup_s, self.transfer_s, self.prefill_s, self.first_token_s, self.ttft_s]
        )


@dataclass(frozen=True, slots=True)
class CalibratedTTFT:
    """Calibrated TTFT per candidate: ``p50_s`` (the routing score) and ``p90_s`` upper bounds, ``(n,)`` seconds."""

    p50_s: np.ndarray
    p90_s: np.ndarray
