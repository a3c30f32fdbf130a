"""Tests for kvcost.models.shift (importance weights of a router's own choices)."""

import numpy as np
import pytest

from kvcost.models.shift import choice_shift_weights, effective_rows


def _choices(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Candidates spread over a queue of 0-10 s; the router chose short queues 9 times in 10."""
    rng = np.random.default_rng(seed)
    short = rng.uniform(0, 2, (180, 1))
    long = rng.uniform(2, 10, (20, 1))
    unchosen = rng.uniform(0, 10, (800, 1))
    return np.vstack([short, long]), unchosen


def test_chosen_rows_like_the_rejected_candidates_weigh_more():
    chosen, unchosen = _choices()
    weights = choice_shift_weights(chosen, unchosen)
    assert weights.shape == (200,) and weights.mean() == pytest.approx(1.0, abs=1e-12)
    # long queues: 10 % of the chosen rows, 80 % of the rejected ones
    assert weights[180:].mean() > 3 * weights[:180].mean()
    assert weights.max() / weights.min() <= 100.0 + 1e-9  # the clip: [1/10, 10] before scaling


def test_too_few_rows_or_mismatched_features_give_equal_weights():
    chosen, unchosen = _choices()
    assert choice_shift_weights(chosen[:9], unchosen).tolist() == [1.0] * 9
    assert choice_shift_weights(chosen, unchosen[:9]).tolist() == [1.0] * 200
    assert choice_shift_weights(chosen, np.hstack([unchosen, unchosen])).tolist() == [1.0] * 200


def test_a_clip_of_one_or_less_is_refused():
    chosen, unchosen = _choices()
    with pytest.raises(ValueError, match="max_weight = 1.0, expected a number > 1"):
        choice_shift_weights(chosen, unchosen, max_weight=1.0)


def test_effective_rows_is_kish_sample_size():
    assert effective_rows(np.ones(8)) == 8.0
    assert effective_rows(np.array([3.0, 1.0])) == 16.0 / 10.0
    assert effective_rows(np.array([])) == 0.0
