"""The hot-spot skew limit's exception for prefix holders (``RouterSettings.max_share_over_mean``)."""

from __future__ import annotations

import numpy as np

from kvcost.routing.policies import argmin_stable


def keep_prefix_holders(
    allowed: np.ndarray, matched_blocks: np.ndarray, queue_s: np.ndarray, score_s: np.ndarray
) -> np.ndarray:
    """The skew limit's ``allowed`` mask with the request's prefix holders put back where they queue no longer.

    The skew limit exists to keep a hot worker from queueing: it spreads load by
    excluding workers over their share of recently routed tokens. Where the
    worker holding the request's prefix has an empty predicted queue, or one no
    longer than the best allowed alternative's, excluding it prevents no
    queueing at all: it only adds prefill (the prefix is recomputed elsewhere)
    and scatters the conversation's or family's KV over several workers, which
    lowers every later hit. That holds on any workload, since it compares the
    queue terms the router already predicted. kvcost issue 13: 8 conversations
    × 10 turns at ~1 % utilisation on 4 workers, ``cost_aware`` moved 5 of 72
    turns off the conversation's worker, twice to a worker predicted at 1.08 s
    and 1.19 s over the holder at 0.137 s and 0.135 s.

    Args:
        allowed: bool ``(n,)``, the share rule's verdict, at least one True.
        matched_blocks: int ``(n,)`` directory-matched prefix blocks per candidate.
        queue_s: predicted queue term per candidate, seconds ``(n,)``.
        score_s: the score the cost-aware policies rank by (lower is better), seconds ``(n,)``.

    Returns:
        bool ``(n,)``: ``allowed``, plus every excluded candidate with the longest
        match (> 0 blocks) whose ``queue_s`` is ≤ 0 or ≤ that of the best-scored
        allowed candidate (lowest index on ties). A holder whose queue is longer
        stays excluded: there the limit still protects the hot worker.
    """
    longest = matched_blocks.max()
    if longest <= 0:
        return allowed
    alternative = argmin_stable(score_s, allowed)
    holders = (matched_blocks == longest) & ~allowed
    no_longer = (queue_s <= 0.0) | (queue_s <= queue_s[alternative])
    return allowed | (holders & no_longer)
