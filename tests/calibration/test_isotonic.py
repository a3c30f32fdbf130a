"""Tests for kvcost.calibration.isotonic (IsotonicCalibrator)."""

import json

import numpy as np
import pytest
from sklearn.isotonic import IsotonicRegression

from kvcost.calibration.isotonic import IsotonicCalibrator

# Pool-adjacent-violators by hand: 3 > 2 pools to 2.5; 4 > 3.5 pools to 3.75, then
# 6 > 0 pools to 3.0 < 3.75, so the last four pool to (4 + 3.5 + 6 + 0) / 4 = 3.375.
PRED_S = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
ACTUAL_S = [1.0, 3.0, 2.0, 4.0, 3.5, 6.0, 0.0]


def test_fit_gives_pooled_adjacent_violators_values():
    cal = IsotonicCalibrator().fit(PRED_S, ACTUAL_S)
    assert cal.transform(PRED_S).tolist() == [1.0, 2.5, 2.5, 3.375, 3.375, 3.375, 3.375]
    # interior knots of a constant run are dropped
    assert cal.x_thresholds_s.tolist() == [1.0, 2.0, 3.0, 4.0, 7.0]
    assert cal.y_thresholds_s.tolist() == [1.0, 2.5, 2.5, 3.375, 3.375]


def test_transform_interpolates_between_knots_clips_below_and_keeps_the_last_ratio_above():
    cal = IsotonicCalibrator().fit(PRED_S, ACTUAL_S)
    # last knot (7.0, 3.375): 100 s maps to 3.375 × 100 / 7, not to 3.375
    assert cal.transform([1.5, 3.5, 0.0, 7.0, 100.0]).tolist() == [1.75, 2.9375, 1.0, 3.375, 48.214285714285715]


def test_transform_preserves_shape():
    cal = IsotonicCalibrator().fit(PRED_S, ACTUAL_S)
    assert cal.transform([[1.0, 2.0], [3.0, 4.0]]).shape == (2, 2)
    scalar = cal.transform(1.5)
    assert scalar.shape == () and float(scalar) == 1.75


def test_transform_matches_sklearn_predict_up_to_the_last_knot():
    rng = np.random.default_rng(0)
    pred = rng.lognormal(-1.0, 1.0, 500)
    actual = pred * rng.lognormal(0.2, 0.3, 500)
    cal = IsotonicCalibrator().fit(pred, actual)
    ref = IsotonicRegression(increasing=True, out_of_bounds="clip").fit(pred, actual)
    probe = np.concatenate([[0.0, 100.0], rng.lognormal(-1.0, 1.5, 200)])
    inside = probe <= pred.max()
    np.testing.assert_allclose(cal.transform(probe[inside]), ref.predict(probe[inside]), rtol=0, atol=1e-12)
    assert np.all(np.diff(cal.transform(np.sort(probe))) >= 0.0)


def test_json_round_trip_gives_identical_transform():
    rng = np.random.default_rng(1)
    pred = rng.lognormal(-1.0, 1.0, 300)
    actual = pred * rng.lognormal(0.0, 0.5, 300)
    cal = IsotonicCalibrator().fit(pred, actual)
    loaded = IsotonicCalibrator.from_dict(json.loads(json.dumps(cal.to_dict(), allow_nan=False)))
    probe = rng.lognormal(-1.0, 1.5, 1000)
    assert np.array_equal(loaded.transform(probe), cal.transform(probe))
    assert loaded.to_dict() == cal.to_dict()


def test_mismatched_shapes_are_an_error():
    with pytest.raises(ValueError, match=r"predicted_s and actual_s must have one shape; got \(3,\) and \(2,\)"):
        IsotonicCalibrator().fit([1.0, 2.0, 3.0], [1.0, 2.0])


def test_non_finite_or_negative_values_are_errors():
    with pytest.raises(ValueError, match=r"actual_s must be finite and ≥ 0 seconds; got nan at index 1"):
        IsotonicCalibrator().fit([1.0, 2.0, 3.0], [1.0, float("nan"), 3.0])
    with pytest.raises(ValueError, match=r"predicted_s must be finite and ≥ 0 seconds; got -0.5 at index 2"):
        IsotonicCalibrator().fit([1.0, 2.0, -0.5], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"predicted_s must be finite and ≥ 0 seconds; got inf at index 0"):
        IsotonicCalibrator().fit([float("inf"), 2.0], [1.0, 2.0])


def test_fewer_than_two_points_is_an_error():
    with pytest.raises(ValueError, match="need at least 2 points to fit; got predicted_s of length 1"):
        IsotonicCalibrator().fit([1.0], [1.0])


def test_transform_before_fit_is_an_error():
    with pytest.raises(RuntimeError, match="before fit"):
        IsotonicCalibrator().transform([1.0])


def test_from_dict_rejects_other_kinds_and_bad_knots():
    with pytest.raises(ValueError, match="expected a 'isotonic' calibrator dict; got kind 'conformal'"):
        IsotonicCalibrator.from_dict({"kind": "conformal"})
    with pytest.raises(ValueError, match="strictly increasing"):
        IsotonicCalibrator.from_dict({"kind": "isotonic", "x_thresholds_s": [2.0, 1.0], "y_thresholds_s": [1.0, 2.0]})
    with pytest.raises(ValueError, match="non-decreasing"):
        IsotonicCalibrator.from_dict({"kind": "isotonic", "x_thresholds_s": [1.0, 2.0], "y_thresholds_s": [2.0, 1.0]})
