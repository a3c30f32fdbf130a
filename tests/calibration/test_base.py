"""Tests for kvcost.calibration.base (CALIBRATORS, calibrator_from_dict)."""

import pytest

from kvcost.calibration import CALIBRATORS, IsotonicCalibrator, SplitConformal, calibrator_from_dict


def test_registered_calibrators():
    assert CALIBRATORS.names() == ["conformal", "isotonic"]
    assert CALIBRATORS.get("isotonic") is IsotonicCalibrator
    assert CALIBRATORS.get("conformal") is SplitConformal
    for name in CALIBRATORS:
        assert CALIBRATORS.get(name).name == name


def test_duplicate_calibrator_name_is_an_error():
    with pytest.raises(ValueError, match="duplicate calibrator name 'isotonic'"):
        CALIBRATORS.add("isotonic", object)


@pytest.mark.parametrize("name", ["isotonic", "conformal"])
def test_every_calibrator_round_trips_through_the_registry(name):
    pred = [0.1, 0.2, 0.4, 0.8, 1.6]
    actual = [0.125, 0.25, 0.375, 1.0, 1.5]
    fitted = CALIBRATORS.get(name)().fit(pred, actual)
    restored = calibrator_from_dict(fitted.to_dict())
    assert type(restored) is type(fitted)
    assert restored.to_dict() == fitted.to_dict()


def test_calibrator_from_dict_unknown_kind():
    with pytest.raises(KeyError, match="unknown calibrator 'platt'; expected one of: conformal, isotonic"):
        calibrator_from_dict({"kind": "platt"})
    with pytest.raises(KeyError, match="no 'kind'"):
        calibrator_from_dict({})
