"""Importance weights for term models trained on a router's own choices (kvcost issue 13 §4).

A router that learns from its own decisions sees the outcome of the candidate it
chose only. The chosen candidates are not a sample of the candidates it ranks:
the queue it sends work to is short, the prefix it sends work to is cached, so
the training rows crowd where the model already predicts well, and the long
queues and cold prefixes it must still rank (and avoid) are rare in them.
Lodestar (2026) reports an offline-trained TTFT predictor collapsing once it
routes; the replay showed the same bias in ``learned_cost_aware`` at 95 % load.

The remedy here is importance weighting over the logged candidates, which works
on a live fleet as it does in a replay, because every candidate's feature row is
logged whether it was chosen or not (the ``candidates`` table). A candidate's
outcome depends on its own features (the worker's state and the request), not on
whether it was chosen, so the chosen rows differ from all candidates only in how
their features are distributed (covariate shift). Each chosen row is weighted by
the density ratio ``p_all(x) / p_chosen(x)``; with a classifier of chosen against
unchosen rows, ``c(x) = P(chosen | x)``, that ratio is ``π / c(x)``, ``π`` the
chosen share (Shimodaira 2000; Bickel, Brückner and Scheffer, JMLR 2009, the
discriminative estimate). The classifier's probabilities are out of fold (two
folds), so a row does not lower its own weight; weights are clipped to
``[1 / MAX_WEIGHT, MAX_WEIGHT]`` and scaled to mean 1 (clipping bounds the
variance that rare rows would otherwise bring).

What it cannot do: weight a region that no chosen row reaches. Where the router
never sends anything, no weight recovers an outcome; that needs exploration,
which costs latency on real requests. The weighting keeps the model's attention
on the chosen rows that look like the candidates it rejects, which is where its
ranking errors are.
"""

from __future__ import annotations

import numpy as np

#: Largest weight (and 1 / smallest) before scaling to mean 1; an assumption that bounds the variance.
MAX_WEIGHT = 10.0
#: At most this many unchosen rows per chosen row are used to fit the classifier (subsampled, seeded).
MAX_UNCHOSEN_PER_CHOSEN = 4


def choice_shift_weights(
    chosen_x: np.ndarray, unchosen_x: np.ndarray, *, max_weight: float = MAX_WEIGHT, seed: int = 0
) -> np.ndarray:
    """Importance weights of the chosen rows toward the distribution of all logged candidates.

    Args:
        chosen_x: float64 ``(n, F)``, the chosen candidates' feature rows (the training rows).
        unchosen_x: float64 ``(m, F)``, feature rows of candidates the router did not choose
            (subsampled to ``MAX_UNCHOSEN_PER_CHOSEN × n`` with ``seed``).
        max_weight: clip of a weight before scaling, > 1.
        seed: seed of the subsample and the classifier.

    Returns:
        float64 ``(n,)``, mean 1. All ones when either set has fewer than 10 rows or the
        feature counts differ from each other (nothing to learn the shift from).

    Raises:
        ValueError: ``max_weight`` ≤ 1.
    """
    if not max_weight > 1:
        raise ValueError(f"max_weight = {max_weight}, expected a number > 1")
    n, m = len(chosen_x), len(unchosen_x)
    if n < 10 or m < 10 or chosen_x.shape[1:] != unchosen_x.shape[1:]:
        return np.ones(n)
    rng = np.random.default_rng(seed)
    if m > MAX_UNCHOSEN_PER_CHOSEN * n:
        unchosen_x = unchosen_x[rng.choice(m, MAX_UNCHOSEN_PER_CHOSEN * n, replace=False)]
        m = len(unchosen_x)
    x = np.vstack([chosen_x, unchosen_x])
    y = np.concatenate([np.ones(n), np.zeros(m)])
    # imported here, not at the top: every kvcost command imports this module (through replay.runner),
    # and importing sklearn takes about 2 s of a command's start
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.model_selection import cross_val_predict

    classifier = HistGradientBoostingClassifier(max_iter=50, max_depth=3, random_state=seed)
    p_chosen = cross_val_predict(classifier, x, y, cv=2, method="predict_proba")[:n, 1]
    share = n / (n + m)
    weights = np.clip(share / np.maximum(p_chosen, 1e-9), 1.0 / max_weight, max_weight)
    return weights / weights.mean()


def effective_rows(weights: np.ndarray) -> float:
    """Kish's effective sample size of ``weights``: ``(Σw)² / Σw²`` (``len`` for equal weights; 0 for none)."""
    total = float(np.sum(weights))
    squares = float(np.sum(np.square(weights)))
    return total * total / squares if squares > 0 else 0.0
