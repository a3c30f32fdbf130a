"""Tests for kvcost.features.decode_length (OutputLengthEstimate)."""

import math

import numpy as np
import pytest

from kvcost.features.decode_length import OutputLengthEstimate


def test_the_prior_alone_gives_its_own_remaining_output():
    # prior: an exponential of mean 172.5 worth 100 completions: (2 × 172.5² − 172.5) / (2 × 172.5) = 172
    assert OutputLengthEstimate(172).mean_tokens == 172.5
    assert OutputLengthEstimate(172).remaining_tokens == pytest.approx(172.0, rel=1e-12)
    assert OutputLengthEstimate(0).remaining_tokens == 0.0


def test_observed_lengths_join_the_prior_by_their_weights():
    # prior 10 (mean 10.5, weight 1), every completion weighs the same:
    # Σ L = 10.5 + 3 + 5 = 18.5, Σ L² = 2 × 10.5² + 9 + 25 = 254.5, r = (254.5 − 18.5) / (2 × 18.5) = 236 / 37
    estimate = OutputLengthEstimate(10, prior_weight=1, window_requests=math.inf)
    estimate.observe(3)
    estimate.observe(np.int64(5))
    assert estimate.remaining_tokens == pytest.approx(236 / 37, rel=1e-12)
    assert estimate.mean_tokens == pytest.approx(18.5 / 3, rel=1e-12)
    # variance ÷ mean²: (254.5 / 3 − (18.5 / 3)²) ÷ (18.5 / 3)² = (3 × 254.5 − 18.5²) / 18.5²
    assert estimate.squared_cv == pytest.approx((3 * 254.5 - 18.5**2) / 18.5**2, rel=1e-12)
    assert estimate.observed == 2


def test_the_prior_is_exponential_and_a_fixed_length_has_the_smallest_spread():
    assert OutputLengthEstimate(172).squared_cv == pytest.approx(1.0, rel=1e-12)  # E[L²] = 2 mean²
    assert OutputLengthEstimate(0, prior_weight=1e-12).squared_cv == pytest.approx(1.0, rel=1e-9)
    fixed = OutputLengthEstimate(0, prior_weight=1, window_requests=1)  # only the last completion counts
    fixed.observe(40)
    assert fixed.squared_cv == 1e-6  # no spread: clipped to a valid gamma shape
    assert OutputLengthEstimate(0, prior_weight=1, window_requests=1).squared_cv == 1.0  # mean 0.5 → 1


def test_a_short_window_forgets_the_prior_and_a_fixed_length_leaves_half_of_it():
    # window 2: weights halve per completion. Prior 0 (mean 0.5, weight 1): Σ L = 0.5, Σ L² = 0.5.
    # After one 4: Σ L = 4.25, Σ L² = 16.25, r = 12 / 8.5; a fixed length L leaves (L − 1) / 2 = 1.5.
    estimate = OutputLengthEstimate(0, prior_weight=1, window_requests=2)
    estimate.observe(4)
    assert estimate.remaining_tokens == pytest.approx(12 / 8.5, rel=1e-12)
    for _ in range(60):
        estimate.observe(4)
    assert estimate.remaining_tokens == pytest.approx(1.5, rel=1e-12)


def test_a_long_tail_puts_the_remaining_output_above_the_mean():
    # nine 10-token answers and one 1000-token one: mean 109, r = (E[L²] − E[L]) / (2 E[L])
    estimate = OutputLengthEstimate(0, prior_weight=1e-9, window_requests=math.inf)
    for length in [10] * 9 + [1000]:
        estimate.observe(length)
    assert estimate.remaining_tokens == pytest.approx((100_090 - 109) / 218, rel=1e-6)


@pytest.mark.parametrize("value", [-1, 2.5, True, "7"])
def test_a_bad_output_length_is_refused_and_changes_nothing(value):
    estimate = OutputLengthEstimate(10, prior_weight=1, window_requests=math.inf)
    estimate.observe(3)
    with pytest.raises(ValueError, match=f"output_tokens = {value!r}, expected an integer ≥ 0"):
        estimate.observe(value)
    assert estimate.remaining_tokens == pytest.approx((2 * 10.5**2 + 9 - 13.5) / 27, rel=1e-12)
    assert estimate.observed == 1


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("prior_tokens", -1.0, "a finite number ≥ 0"),
        ("prior_tokens", math.nan, "a finite number ≥ 0"),
        ("prior_weight", 0.0, "a finite number > 0"),
        ("window_requests", 0.5, "a number ≥ 1 or inf"),
    ],
)
def test_settings_out_of_range_are_refused_by_name(field, value, expected):
    with pytest.raises(ValueError, match=f"{field} = {value!r}, expected {expected}"):
        OutputLengthEstimate(**{field: value})
