"""Isotonic recalibration of the composed TTFT.

The per-term models are trained term by term, and their sum (or critical-path
max, :mod:`kvcost.core.composition`) can be biased as a whole: overlapping
terms, correlated errors, a term that is missing. An isotonic regression of
the actual TTFT on the predicted TTFT fixes such bias without changing the
ranking of candidates: the map is non-decreasing, so a worker predicted to be
faster stays at least as fast after calibration.

Method: pool-adjacent-violators (PAV) as implemented by scikit-learn's
``IsotonicRegression(increasing=True, out_of_bounds="clip")`` (Barlow et al.
1972, "Statistical Inference under Order Restrictions"; Zadrozny & Elkan 2002
for its use in calibration). After fitting only the knots
(``X_thresholds_``, ``y_thresholds_``) are kept: the transform is
``np.interp`` over them (linear between knots, clipped to the first knot's
value below the fitted range), which is what scikit-learn's ``predict``
computes inside the range, so the stored model is two short float lists,
loads without pickle and scores in microseconds.

Above the fitted range the map is **not** clipped: a prediction ``x`` beyond
the last knot ``(x_k, y_k)`` maps to ``y_k · x / x_k``, the last knot's ratio
carried on (continuous at ``x_k``, still non-decreasing). Why: clipping makes
every candidate predicted past the largest TTFT of the calibration slice
equal, and caps the conformal bounds built on it. Under a load the training
data never saw (a queue that keeps growing) the served P90 then stayed at the
slice's largest TTFT while the composed P50 doubled: kvcost issue 13 measured
0 % served coverage on an overloaded generated workload with P90 bounds of
18.4 s against P50 predictions of 36–40 s. TTFT errors are multiplicative (a
queue mispredicted by 30 % is off by 30 % whatever its length; the same
reason the served-bound factor works in log space), so the ratio is what
carries over to loads past the slice, whatever the workload.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Self

import numpy as np

from kvcost.calibration.base import CALIBRATORS, as_seconds, check_kind, check_pairs


@CALIBRATORS.register("isotonic")
class IsotonicCalibrator:
    """Monotone map from predicted TTFT (s) to calibrated TTFT (s).

    Construction is pure; :meth:`fit` fits. The fitted state is the knot arrays
    :attr:`x_thresholds_s` and :attr:`y_thresholds_s` (float64, shape ``(k,)``,
    ``1 ≤ k ≤ n``, x strictly increasing, y non-decreasing and ≥ 0).

    Thread safety: not thread-safe while fitting; one owner. A fitted instance
    is read-only in :meth:`transform` and may be shared by readers.

    Example
    -------
    >>> cal = IsotonicCalibrator().fit([1.0, 2.0, 3.0], [1.0, 3.0, 2.0])
    >>> cal.transform([0.5, 1.0, 2.0, 3.0, 6.0]).tolist()
    [1.0, 1.0, 2.5, 2.5, 5.0]
    """

    name: ClassVar[str] = "isotonic"

    def __init__(self) -> None:
        self.x_thresholds_s: np.ndarray | None = None
        self.y_thresholds_s: np.ndarray | None = None

    @property
    def is_fitted(self) -> bool:
        """True after :meth:`fit` or :meth:`from_dict`."""
        return self.x_thresholds_s is not None

    def fit(self, predicted_s: Any, actual_s: Any) -> Self:
        """Fit the non-decreasing map on logged pairs.

        Args:
            predicted_s: predicted (composed) TTFT, seconds, shape ``(n,)``, finite, ≥ 0.
            actual_s: measured TTFT of the same requests, seconds, shape ``(n,)``, finite, ≥ 0.

        Returns:
            ``self``, fitted. Refitting replaces the previous fit.

        Raises:
            ValueError: shapes differ or are not 1-D, ``n < 2``, or a value is
                NaN, infinite or negative (the message names the argument and value).
        """
        pred, act = check_pairs(predicted_s, actual_s, predicted_name="predicted_s")
        from sklearn.isotonic import IsotonicRegression  # lazy: importing sklearn costs ~1 s

        iso = IsotonicRegression(increasing=True, out_of_bounds="clip").fit(pred, act)
        self.x_thresholds_s = np.asarray(iso.X_thresholds_, dtype=np.float64).copy()
        self.y_thresholds_s = np.maximum(np.asarray(iso.y_thresholds_, dtype=np.float64), 0.0)
        return self

    def transform(self, predicted_s: Any) -> np.ndarray:
        """Calibrated TTFT for predicted TTFT values.

        Args:
            predicted_s: seconds, any shape (a scalar gives a 0-d array), finite
                and ≥ 0. Values below the fitted range are clipped to the first knot's value;
                values above it keep the last knot's ratio ``y_k / x_k`` (module docstring).

        Returns:
            float64 array of the same shape, seconds, ≥ 0.

        Raises:
            RuntimeError: called before :meth:`fit`.
            ValueError: a value is NaN, infinite or negative.
        """
        if self.x_thresholds_s is None or self.y_thresholds_s is None:
            raise RuntimeError("IsotonicCalibrator.transform called before fit(); fit or from_dict first")
        pred = as_seconds(predicted_s, "predicted_s")
        out = np.interp(pred, self.x_thresholds_s, self.y_thresholds_s)
        x_last, y_last = self.x_thresholds_s[-1], self.y_thresholds_s[-1]
        if x_last > 0:
            above = pred > x_last
            out = np.where(above, y_last * pred / x_last, out)
        return out.reshape(pred.shape)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe state: ``{"kind", "x_thresholds_s", "y_thresholds_s"}`` (lists of floats).

        Raises:
            RuntimeError: not fitted.
        """
        if self.x_thresholds_s is None or self.y_thresholds_s is None:
            raise RuntimeError("IsotonicCalibrator.to_dict called before fit()")
        return {
            "kind": self.name,
            "x_thresholds_s": self.x_thresholds_s.tolist(),
            "y_thresholds_s": self.y_thresholds_s.tolist(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Rebuild a fitted calibrator from :meth:`to_dict` output.

        Raises:
            ValueError: wrong ``kind``; knots empty, of different lengths, not
                finite and ≥ 0, x not strictly increasing or y decreasing.
        """
        check_kind(data, cls.name)
        x = as_seconds(data["x_thresholds_s"], "x_thresholds_s")
        y = as_seconds(data["y_thresholds_s"], "y_thresholds_s")
        if x.ndim != 1 or x.shape != y.shape or x.size == 0:
            raise ValueError(
                f"x_thresholds_s and y_thresholds_s must be non-empty 1-D of one shape; got {x.shape}, {y.shape}"
            )
        if np.any(np.diff(x) <= 0.0):
            raise ValueError(f"x_thresholds_s must be strictly increasing; got {x.tolist()}")
        if np.any(np.diff(y) < 0.0):
            raise ValueError(f"y_thresholds_s must be non-decreasing; got {y.tolist()}")
        out = cls()
        out.x_thresholds_s, out.y_thresholds_s = x, y
        return out

    def __repr__(self) -> str:
        knots = "unfitted" if self.x_thresholds_s is None else f"{self.x_thresholds_s.size} knots"
        return f"IsotonicCalibrator({knots})"
