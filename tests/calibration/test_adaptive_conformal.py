"""Tests for kvcost.calibration.adaptive_conformal (the ACI offset, the log-space ACI scale, the served bounds)."""

import math

import pytest

from kvcost.calibration.adaptive_conformal import (
    MAX_LOG_SCALE,
    AdaptiveConformalOffset,
    AdaptiveConformalScale,
    ServedBounds,
)


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


def test_scale_is_clipped_so_a_burst_of_late_misses_cannot_run_away():
    aci = AdaptiveConformalScale(target_miss_rate=0.1, step=0.5)
    for _ in range(1000):  # a backlog of outcomes all served with the old bound
        aci.update(1.0, 2.0)
    assert aci.log_scale == pytest.approx(MAX_LOG_SCALE) and aci.factor == pytest.approx(100.0)
    assert aci.update(1.0, 0.5) is False and aci.log_scale == pytest.approx(MAX_LOG_SCALE - 0.05)


def test_served_bounds_resolve_each_request_once():
    bounds = ServedBounds(AdaptiveConformalScale(step=0.5))
    bounds.add(1, 1.0, 0.0)
    assert bounds.resolve(7, 1.0) is None  # never served
    assert bounds.resolve(1, 1.5) is True
    assert bounds.resolve(1, 1.5) is None
    assert (len(bounds), bounds.scale.updates) == (0, 1)


def test_a_request_past_its_bound_is_a_miss_before_its_first_token():
    bounds = ServedBounds(AdaptiveConformalScale(step=0.5))
    bounds.add(1, 1.0, 0.0)
    bounds.add(2, 4.0, 0.0)
    assert bounds.expire(0.5) == 0
    assert bounds.expire(1.5) == 1  # request 1 has waited 1.5 s > its 1 s bound: θ = 0.45
    assert bounds.scale.log_scale == pytest.approx(0.45) and len(bounds) == 1
    assert bounds.resolve(1, 2.0) is None  # already counted
    assert bounds.expire(3.9) == 0 and bounds.resolve(2, 3.0) is False  # request 2 came in time
    assert bounds.expire(10.0) == 0 and len(bounds) == 0
    assert bounds.scale.log_scale == pytest.approx(0.4)


def test_served_bounds_keep_no_unbounded_request_and_forget_the_oldest():
    bounds = ServedBounds(AdaptiveConformalScale(), max_pending=1)
    bounds.add(1, math.nan, 0.0)
    bounds.add(2, math.inf, 0.0)
    assert len(bounds) == 0 and bounds.expire(1e9) == 0
    bounds.add(3, 1.0, 0.0)
    bounds.add(4, 1.0, 0.0)
    assert len(bounds) == 1 and bounds.resolve(3, 0.5) is None and bounds.resolve(4, 0.5) is False
    with pytest.raises(ValueError, match=r"^max_pending = 0, expected an integer ≥ 1$"):
        ServedBounds(AdaptiveConformalScale(), max_pending=0)
