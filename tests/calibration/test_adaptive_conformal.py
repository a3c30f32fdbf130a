"""Tests for kvcost.calibration.adaptive_conformal (the ACI offset and the log-space ACI scale)."""

import math

import pytest

from kvcost.calibration.adaptive_conformal import AdaptiveConformalOffset, AdaptiveConformalScale


def test_offset_update_on_a_hand_computed_sequence():
    aci = AdaptiveConformalOffset(target_miss_rate=0.1, step_s=0.1)
    # (forecast, observed) → bound before the update, miss, offset after = offset + 0.1 × (miss − 0.1)
    steps = [
        ((1.0, 1.5), 1.00, True, 0.09),
        ((1.0, 1.05), 1.09, False, 0.08),
        ((1.0, 1.2), 1.08, True, 0.17),
        ((2.0, 2.17), 2.17, False, 0.16),  # on the bound is not a miss
    ]
    for (forecast, observed), bound, miss, offset in steps:
        assert aci.bound_s(forecast) == pytest.approx(bound)
        assert aci.update(forecast, observed) is miss
        assert aci.offset_s == pytest.approx(offset)
    assert aci.updates == 4


def test_a_calibrated_forecast_keeps_the_offset_on_average():
    aci = AdaptiveConformalOffset(target_miss_rate=0.1, step_s=0.05)
    for i in range(100):  # exactly one miss in ten
        aci.update(1.0, 2.0 if i % 10 == 0 else 0.5)
    assert aci.offset_s == pytest.approx(0.0)


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError, match="target_miss_rate = 1"):
        AdaptiveConformalOffset(target_miss_rate=1.0)
    with pytest.raises(ValueError, match="step_s = 0"):
        AdaptiveConformalOffset(step_s=0.0)


def test_scale_update_on_a_hand_computed_sequence():
    aci = AdaptiveConformalScale(target_miss_rate=0.1, step=0.05)
    assert aci.update(2.0, 2.5) is True  # miss: θ = 0.05 × 0.9
    assert aci.log_scale == pytest.approx(0.045) and aci.factor == pytest.approx(math.exp(0.045))
    assert aci.update(2.0, 2.0) is False  # at the bound is covered: θ = 0.045 − 0.005
    assert (aci.log_scale, aci.updates) == (pytest.approx(0.04), 2)


def test_scale_bad_parameters_are_refused():
    with pytest.raises(ValueError, match=r"^target_miss_rate = 0.0, expected a number in \(0, 1\)$"):
        AdaptiveConformalScale(target_miss_rate=0.0)
    with pytest.raises(ValueError, match=r"^step = -1, expected a number > 0$"):
        AdaptiveConformalScale(step=-1)
