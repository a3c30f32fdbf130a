"""Tests for kvcost.core.composition (compose_ttft_s, TermPredictions)."""

import numpy as np
import pytest

from kvcost.core.composition import TERMS, TermPredictions, compose_ttft_s


def test_overlapped_transfer_takes_the_max_with_queue():
    # Q = 0.25, L = 0.01, X = 0.1, P = 0.05, F = 0.002: max(0.25, 0.1) + 0.062
    assert compose_ttft_s(0.25, 0.01, 0.1, 0.05, 0.002) == pytest.approx(0.312)
    # transfer longer than the queue: it is the head of the critical path
    assert compose_ttft_s(0.03, 0.01, 0.1, 0.05, 0.002) == pytest.approx(0.162)


def test_serial_path_adds_every_term():
    serial = compose_ttft_s(0.25, 0.01, 0.1, 0.05, 0.002, transfer_overlaps_queue=False)
    assert serial == pytest.approx(0.412)


def test_forms_agree_without_transfer():
    args = (0.25, 0.005, 0.0, 0.015, 0.0)
    assert compose_ttft_s(*args) == compose_ttft_s(*args, transfer_overlaps_queue=False) == 0.27


def test_scalar_gives_float():
    out = compose_ttft_s(1, 0, 0, 2, 0)
    assert isinstance(out, float) and out == 3.0


def test_arrays_elementwise():
    queue_s = np.array([0.25, 0.03, 0.0])
    transfer_s = np.array([0.0, 0.1, 0.2])
    zeros = np.zeros(3)
    prefill_s = np.array([0.02, 0.18, 0.01])
    overlapped = compose_ttft_s(queue_s, zeros, transfer_s, prefill_s, zeros)
    serial = compose_ttft_s(queue_s, zeros, transfer_s, prefill_s, zeros, transfer_overlaps_queue=False)
    assert isinstance(overlapped, np.ndarray) and overlapped.shape == (3,)
    assert overlapped.tolist() == pytest.approx([0.27, 0.28, 0.21])
    assert serial.tolist() == pytest.approx([0.27, 0.31, 0.21])


def test_term_predictions_ttft_and_matrix():
    p = TermPredictions(
        queue_s=np.array([0.25, 0.03]),
        lookup_s=np.array([0.005, 0.0]),
        transfer_s=np.array([0.0, 0.05]),
        prefill_s=np.array([0.015, 0.18]),
        first_token_s=np.array([0.0, 0.001]),
    )
    assert p.ttft_s.tolist() == pytest.approx([0.27, 0.231])  # cold: max(0.03, 0.05) + 0.181
    m = p.as_matrix()
    assert m.shape == (2, len(TERMS) + 1) == (2, 6)
    assert m[1].tolist() == pytest.approx([0.03, 0.0, 0.05, 0.18, 0.001, 0.231])
    assert TERMS == ("queue", "lookup", "transfer", "prefill", "first_token")


def test_term_predictions_compose_ttft_once_at_construction():
    zeros = np.zeros(2)
    p = TermPredictions(np.array([0.25, 0.125]), zeros, np.array([0.0, 0.5]), np.array([0.25, 0.125]), zeros)
    assert p.ttft_s is p.ttft_s  # a field, not recomposed on every read
    assert p.ttft_s.tolist() == [0.5, 0.625]  # max(Q, X) + P
    assert p.take(np.array([1])).ttft_s.tolist() == [0.625]
    with pytest.raises(TypeError, match="ttft_s"):
        TermPredictions(zeros, zeros, zeros, zeros, zeros, ttft_s=zeros)
