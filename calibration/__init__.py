"""kvcost.calibration: isotonic recalibration, split-conformal bounds, drift monitoring.

Importing this package registers every calibrator in :data:`CALIBRATORS`
(``"isotonic"``, ``"conformal"``).
"""

from kvcost.calibration import conformal, isotonic  # noqa: F401  (importing registers the calibrators)
from kvcost.calibration.base import CALIBRATORS, Calibrator, calibrator_from_dict
from kvcost.calibration.conformal import SplitConformal
from kvcost.calibration.drift import MONITORED_TERMS, DriftAlert, DriftMonitor
from kvcost.calibration.isotonic import IsotonicCalibrator

__all__ = [
    "CALIBRATORS",
    "MONITORED_TERMS",
    "Calibrator",
    "DriftAlert",
    "DriftMonitor",
    "IsotonicCalibrator",
    "SplitConformal",
    "calibrator_from_dict",
]
