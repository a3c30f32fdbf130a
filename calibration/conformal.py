"""Split-conformal upper bounds for the calibrated TTFT.

Method: split (inductive) conformal prediction (Vovk, Gammerman & Shafer 2005,
"Algorithmic Learning in a Random World"; Papadopoulos et al. 2002; Lei,
G'Sell, Rinaldo, Tibshirani & Wasserman 2018, "Distribution-free predictive
inference for regression", JASA 113(523)). The point predictor (per-term
models, composition, isotonic recalibration) is fitted on a training slice;
on a separate calibration slice of ``n`` requests we compute nonconformity
scores ``s_i``; for a level ``α`` the bound is set by the ``k``-th smallest
score with the finite-sample correction

    k = ⌈(n + 1) · α⌉,    q_α = s_(k)    (q_α = +∞ when k > n).

If calibration and test requests are exchangeable, a new request's actual TTFT
is at most its upper bound with probability ≥ α (and < α + 1/(n + 1) when the
scores have no ties). The guarantee is marginal, over requests; it is one-sided
because the router only needs "at most this slow".

Scores (``score=``):

- ``"absolute"``: ``s = actual − pred``; bound ``pred + q_α``. One width in
  seconds for every request.
- ``"relative"`` (default): ``s = (actual − pred) / max(pred, floor_s)``; bound
  ``pred + q_α · max(pred, floor_s)``. TTFT spans orders of magnitude (a
  cached short prompt on an idle worker takes tens of ms, a long prefill behind
  a queue takes seconds), and errors grow with it; one absolute width would be
  far too wide for short requests and too narrow for long ones. The relative
  score gives a multiplicative width, the normalised-score ("locally
  weighted") variant discussed by Lei et al. 2018. ``floor_s`` (default
  0.05 s, the order of the fastest TTFTs) keeps the score finite and stops
  near-zero predictions from producing huge ratios; below it the width is
  absolute. Coverage holds for either score; only the width's shape differs.

Bounds are clipped at 0 s (a P50 quantile can be negative when the model
over-predicts).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal, Self

import numpy as np

from kvcost.calibration.base import CALIBRATORS, as_seconds, check_kind, check_pairs

Score = Literal["absolute", "relative"]
_SCORES: tuple[str, ...] = ("absolute", "relative")

# (n + 1) · α is computed in binary floating point: 10 × 0.9 may land a hair
# above 9 and ceil would give 10. Levels are stated with few decimals, so a
# product within this tolerance of an integer is that integer.
_CEIL_TOLERANCE = 1e-9


def conformal_rank(n: int, level: float) -> int:
    """The 1-based rank ``k = ⌈(n + 1) · level⌉`` of the score that bounds at ``level``.

    ``k > n`` means the calibration set is too small for the level (bound +∞).

    Raises:
        ValueError: ``n < 1`` or ``level`` not in (0, 1).
    """
    if n < 1:
        raise ValueError(f"n must be ≥ 1; got {n}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1); got {level!r}")
    return max(1, math.ceil((n + 1) * level - _CEIL_TOLERANCE))


@CALIBRATORS.register("conformal")
class SplitConformal:
    """One-sided split-conformal upper bounds at several levels.

    Args:
        levels: coverage levels α in (0, 1), e.g. ``(0.5, 0.9)`` for P50 and P90
            upper bounds; stored sorted and de-duplicated.
        score: ``"relative"`` (default) or ``"absolute"``; see the module docstring.
        floor_s: denominator floor of the relative score, seconds, > 0
            (default 0.05 s); ignored by the absolute score.

    Fitted state: :attr:`quantiles` (level → score quantile ``q_α``, ``+inf``
    when ``n`` is too small) and :attr:`n_calibration`.

    Raises:
        ValueError: a level outside (0, 1), no levels, an unknown score, or
            ``floor_s`` not finite and > 0.

    Thread safety: not thread-safe while fitting; one owner. A fitted instance
    is read-only in :meth:`upper_bounds` and may be shared by readers.

    Example
    -------
    >>> conf = SplitConformal(levels=(0.5,), score="absolute").fit([1.0] * 3, [1.0, 1.5, 2.0])
    >>> conf.upper_bounds([2.0])[0.5].tolist()  # k = ⌈4 · 0.5⌉ = 2 → q = 0.5
    [2.5]
    """

    name: ClassVar[str] = "conformal"

    def __init__(self, levels: Sequence[float] = (0.5, 0.9), score: Score = "relative", floor_s: float = 0.05) -> None:
        if score not in _SCORES:
            raise ValueError(f"score must be one of {', '.join(_SCORES)}; got {score!r}")
        if not (math.isfinite(floor_s) and floor_s > 0.0):
            raise ValueError(f"floor_s must be finite and > 0 seconds; got {floor_s!r}")
        levels = tuple(sorted({float(level) for level in levels}))
        if not levels:
            raise ValueError("levels must name at least one level in (0, 1); got none")
        for level in levels:
            if not 0.0 < level < 1.0:
                raise ValueError(f"levels must be in (0, 1); got {level!r}")
        self.levels: tuple[float, ...] = levels
        self.score: Score = score
        self.floor_s = float(floor_s)
        self.quantiles: dict[float, float] | None = None
        self.n_calibration = 0

    @property
    def is_fitted(self) -> bool:
        """True after :meth:`fit` or :meth:`from_dict`."""
        return self.quantiles is not None

    def _scale_s(self, pred: np.ndarray) -> np.ndarray | float:
        """Score denominator: ``max(pred, floor_s)`` (relative) or 1 (absolute)."""
        return np.maximum(pred, self.floor_s) if self.score == "relative" else 1.0

    def scores(self, calibrated_s: Any, actual_s: Any) -> np.ndarray:
        """Nonconformity scores, shape ``(n,)``: dimensionless (relative) or seconds (absolute).

        Raises:
            ValueError: as :meth:`fit` (``n ≥ 1`` suffices here).
        """
        pred, act = check_pairs(calibrated_s, actual_s, predicted_name="calibrated_s", min_points=1)
        return (act - pred) / self._scale_s(pred)

    def fit(self, calibrated_s: Any, actual_s: Any) -> Self:
        """Fit the score quantiles on a calibration slice (separate from training and holdout).

        Args:
            calibrated_s: calibrated TTFT predictions, seconds, shape ``(n,)``, finite, ≥ 0.
            actual_s: measured TTFT of the same requests, seconds, shape ``(n,)``, finite, ≥ 0.

        Returns:
            ``self``. A level with ``⌈(n + 1)α⌉ > n`` gets ``q_α = +inf``.

        Raises:
            ValueError: shapes differ or are not 1-D, ``n < 2``, or a value is
                NaN, infinite or negative (the message names the argument and value).
        """
        pred, act = check_pairs(calibrated_s, actual_s, predicted_name="calibrated_s")
        ordered = np.sort((act - pred) / self._scale_s(pred))
        n = ordered.size
        quantiles = {}
        for level in self.levels:
            k = conformal_rank(n, level)
            quantiles[level] = float(ordered[k - 1]) if k <= n else math.inf
        self.quantiles = quantiles
        self.n_calibration = n
        return self

    def upper_bounds(self, calibrated_s: Any) -> dict[float, np.ndarray]:
        """Upper bounds on the actual TTFT at every level.

        Args:
            calibrated_s: calibrated TTFT, seconds, any shape, finite, ≥ 0.

        Returns:
            level → float64 array of the input's shape, seconds, ≥ 0 (``+inf`` where
            the calibration set was too small for the level). Non-decreasing in level.

        Raises:
            RuntimeError: called before :meth:`fit`.
            ValueError: a value is NaN, infinite or negative.
        """
        if self.quantiles is None:
            raise RuntimeError("SplitConformal.upper_bounds called before fit(); fit or from_dict first")
        pred = as_seconds(calibrated_s, "calibrated_s")
        scale = self._scale_s(pred)
        return {level: np.maximum(pred + q * scale, 0.0) for level, q in self.quantiles.items()}

    @staticmethod
    def coverage(upper_s: Any, actual_s: Any) -> float:
        """Share of requests whose actual TTFT is at most its upper bound, in [0, 1].

        Args:
            upper_s: upper bounds, seconds, shape ``(n,)``, ≥ 0, ``+inf`` allowed.
            actual_s: measured TTFT, seconds, shape ``(n,)``, finite, ≥ 0.

        Raises:
            ValueError: shapes differ, ``n == 0``, or a value out of range.
        """
        upper = as_seconds(upper_s, "upper_s", allow_inf=True)
        act = as_seconds(actual_s, "actual_s")
        if upper.shape != act.shape:
            raise ValueError(f"upper_s and actual_s must have one shape; got {upper.shape} and {act.shape}")
        if act.size == 0:
            raise ValueError("coverage needs at least one request; got actual_s of length 0")
        return float(np.mean(act <= upper))

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe state (``+inf`` quantiles stored as ``None``).

        Keys: ``kind``, ``score``, ``floor_s``, ``n_calibration``, ``levels``,
        ``quantiles`` (list aligned with ``levels``).

        Raises:
            RuntimeError: not fitted.
        """
        if self.quantiles is None:
            raise RuntimeError("SplitConformal.to_dict called before fit()")
        return {
            "kind": self.name,
            "score": self.score,
            "floor_s": self.floor_s,
            "n_calibration": self.n_calibration,
            "levels": list(self.levels),
            "quantiles": [None if math.isinf(q) else q for q in self.quantiles.values()],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Rebuild a fitted instance from :meth:`to_dict` output.

        Raises:
            ValueError: wrong ``kind``, invalid config, or ``quantiles`` not aligned
                with ``levels``.
        """
        check_kind(data, cls.name)
        out = cls(levels=data["levels"], score=data["score"], floor_s=data["floor_s"])
        stored = list(data["quantiles"])
        if list(out.levels) != [float(level) for level in data["levels"]] or len(stored) != len(out.levels):
            raise ValueError(
                f"levels must be sorted, unique and aligned with quantiles; got {data['levels']} and {stored}"
            )
        out.quantiles = {
            level: math.inf if q is None else float(q) for level, q in zip(out.levels, stored, strict=True)
        }
        out.n_calibration = int(data["n_calibration"])
        return out

    def __repr__(self) -> str:
        state = "unfitted" if self.quantiles is None else f"n={self.n_calibration}"
        return f"SplitConformal(levels={self.levels}, score={self.score!r}, floor_s={self.floor_s}, {state})"
