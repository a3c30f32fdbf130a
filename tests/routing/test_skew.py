"""Tests for kvcost.routing.skew (the skew limit's exception for prefix holders)."""

import numpy as np
import pytest

from kvcost.routing.skew import keep_prefix_holders


@pytest.mark.parametrize(
    ("allowed", "blocks", "queue_s", "expected"),
    [
        # holder 0 excluded, empty queue: put back
        ([False, True, True], [4, 0, 0], [0.0, 0.1, 0.1], [True, True, True]),
        # queue equal to the best alternative's (1, by score): put back
        ([False, True, True], [4, 0, 0], [0.1, 0.1, 0.0], [True, True, True]),
        # shorter than the best alternative's (1, by score), though 2 has none: put back
        ([False, True, True], [4, 0, 0], [0.2, 0.3, 0.0], [True, True, True]),
        # longer than the best alternative's (1, by score), though shorter than 2's: stays out
        ([False, True, True], [4, 0, 0], [0.2, 0.1, 0.3], [False, True, True]),
        # only the longest match counts; no match at all changes nothing
        ([False, False, True], [4, 2, 0], [0.0, 0.0, 0.1], [True, False, True]),
        ([False, True, True], [0, 0, 0], [0.0, 0.1, 0.1], [False, True, True]),
    ],
)
def test_keep_prefix_holders(allowed, blocks, queue_s, expected):
    score_s = np.array([0.0, 0.5, 0.6])  # candidate 1 is the best-scored allowed alternative where allowed
    kept = keep_prefix_holders(np.array(allowed), np.array(blocks), np.array(queue_s), score_s)
    assert kept.tolist() == expected
