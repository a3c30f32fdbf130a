"""The calibrator registry, the calibrator contract and shared input checks.

Every calibrator is registered by a permanent name in :data:`CALIBRATORS`
(docs/architecture.md §3, "Rules of the house"); a duplicate name is a ``ValueError``
raised by :class:`~kvcost.core.registry.Registry`. Importing
:mod:`kvcost.calibration` registers ``"isotonic"``
(:class:`~kvcost.calibration.isotonic.IsotonicCalibrator`) and ``"conformal"``
(:class:`~kvcost.calibration.conformal.SplitConformal`).

A calibrator is fitted on pairs ``(predicted_s, actual_s)`` and persisted as a
plain JSON-safe dict whose ``"kind"`` is its registered name, so
:func:`calibrator_from_dict` restores any of them without pickle.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Protocol, Self

import numpy as np

from kvcost.core.registry import Registry


class Calibrator(Protocol):
    """What every registered calibrator provides.

    ``fit(predicted_s, actual_s)`` takes two 1-D float arrays of one shape
    ``(n,)`` in seconds (finite, ≥ 0) and returns ``self``; ``to_dict()`` gives a
    JSON-safe dict (no NaN or infinity) with ``"kind"`` equal to ``name``;
    ``from_dict(data)`` rebuilds an equal, fitted calibrator.
    """

    name: ClassVar[str]

    def fit(self, predicted_s: np.ndarray, actual_s: np.ndarray) -> Self: ...

    def to_dict(self) -> dict[str, Any]: ...

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self: ...


CALIBRATORS: Registry[type] = Registry("calibrator")


def calibrator_from_dict(data: Mapping[str, Any]) -> Calibrator:
    """Restore a fitted calibrator from ``to_dict()`` output, dispatching on ``data["kind"]``.

    Raises:
        KeyError: ``data`` has no ``"kind"``, or the kind is not registered (the
            message lists the registered names).
        ValueError: the stored fields are malformed (raised by the class).
    """
    if "kind" not in data:
        raise KeyError("calibrator dict has no 'kind'; expected one of: " + ", ".join(CALIBRATORS.names()))
    return CALIBRATORS.get(data["kind"]).from_dict(data)


def as_seconds(values: Any, name: str, *, allow_inf: bool = False) -> np.ndarray:
    """``values`` as a float64 array of seconds, checked finite (or +inf if allowed) and ≥ 0.

    Shape is preserved (a scalar gives a 0-d array).

    Raises:
        ValueError: a value is NaN, infinite (unless ``allow_inf`` and +inf) or
            negative; the message names ``name``, the first bad index and value.
    """
    arr = np.asarray(values, dtype=np.float64)
    ok = (arr >= 0.0) & (np.isfinite(arr) | (allow_inf & (arr == np.inf)))
    if not ok.all():
        index = tuple(int(i) for i in np.argwhere(~ok)[0])
        where = f" at index {index[0] if len(index) == 1 else index}" if index else ""
        what = "finite or +inf and ≥ 0" if allow_inf else "finite and ≥ 0"
        raise ValueError(f"{name} must be {what} seconds; got {float(arr[index])!r}{where}")
    return arr


def check_pairs(
    predicted: Any, actual: Any, *, predicted_name: str, actual_name: str = "actual_s", min_points: int = 2
) -> tuple[np.ndarray, np.ndarray]:
    """Validate a fitting set: two 1-D arrays of seconds of one shape with at least ``min_points``.

    Returns:
        ``(predicted, actual)`` as float64 arrays of shape ``(n,)``.

    Raises:
        ValueError: not 1-D, shapes differ, fewer than ``min_points`` points, or a
            value that is not finite and ≥ 0 (the message names the argument).
    """
    pred = as_seconds(predicted, predicted_name)
    act = as_seconds(actual, actual_name)
    if pred.ndim != 1 or act.ndim != 1:
        raise ValueError(f"{predicted_name} and {actual_name} must be 1-D; got shapes {pred.shape} and {act.shape}")
    if pred.shape != act.shape:
        raise ValueError(f"{predicted_name} and {actual_name} must have one shape; got {pred.shape} and {act.shape}")
    if pred.shape[0] < min_points:
        raise ValueError(f"need at least {min_points} points to fit; got {predicted_name} of length {pred.shape[0]}")
    return pred, act


def check_kind(data: Mapping[str, Any], expected: str) -> None:
    """Raise ``ValueError`` unless ``data["kind"] == expected``."""
    kind = data.get("kind")
    if kind != expected:
        raise ValueError(f"expected a {expected!r} calibrator dict; got kind {kind!r}")
