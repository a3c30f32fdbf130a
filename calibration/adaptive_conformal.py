"""Adaptive conformal offset for an online quantile forecast (ACI).

Method: adaptive conformal inference (Gibbs & Candès 2021, "Adaptive Conformal
Inference Under Distribution Shift", NeurIPS 2021). After each outcome the
miscoverage indicator ``miss_t`` (1 when the observed value exceeded the bound
given for it, else 0) moves the bound by a step against the target miss rate
``α``. Gibbs & Candès move the quantile level, ``α_{t+1} = α_t + γ(α − miss_t)``;
here the step moves an additive offset in seconds on the forecast, the
"quantile tracking" form (Angelopoulos, Candès & Tibshirani 2023, "Conformal
PID Control for Time Series Prediction", NeurIPS 2023)::

    bound_t = forecast_t + offset_t
    offset_{t+1} = offset_t + γ · (miss_t − α)

Summing the updates, the realised miss rate over ``T`` outcomes differs from
``α`` by ``(offset_T − offset_0) / (γ T)``, which goes to 0 whenever the
observed values (so the offset) stay bounded, whatever the data (Angelopoulos
et al. 2023, Prop. 1): a forecast that runs too low or too high under drift is
corrected between refits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: γ of :class:`AdaptiveConformalScale`: 0.05 moves the bound ~5 % after a miss and ~0.5 % after a hit
#: (α = 0.1), so ~20 consecutive misses double it; Angelopoulos et al. (2023) use steps of this size
#: relative to the score's scale. Not tuned on any trace.
DEFAULT_SCALE_STEP = 0.05


@dataclass
class AdaptiveConformalOffset:
    """An additive offset on a quantile forecast, updated after every outcome.

    Attributes:
        target_miss_rate: α, the share of outcomes allowed above the bound, in (0, 1)
            (0.1 for a P90 bound).
        step_s: γ, seconds the offset moves per unit of ``miss − α`` (> 0).
        offset_s: current offset, seconds (starts at 0).
        updates: outcomes seen so far.

    Raises:
        ValueError: ``target_miss_rate`` outside (0, 1) or ``step_s`` ≤ 0.
    """

    target_miss_rate: float = 0.1
    step_s: float = 0.01
    offset_s: float = 0.0
    updates: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.target_miss_rate < 1:
            raise ValueError(f"target_miss_rate = {self.target_miss_rate}, expected a number in (0, 1)")
        if not self.step_s > 0:
            raise ValueError(f"step_s = {self.step_s}, expected a number > 0")

    def bound_s(self, forecast_s: float) -> float:
        """The bound for a forecast: ``forecast_s + offset_s``, seconds."""
        return forecast_s + self.offset_s

    def update(self, forecast_s: float, observed_s: float) -> bool:
        """Score one outcome against the bound its forecast had; returns whether it was a miss.

        The bound uses the offset before this update (outcomes may arrive in another order than
        the decisions that produced them, so it is the current offset, not the decision's).
        """
        miss = observed_s > self.bound_s(forecast_s)
        self.offset_s += self.step_s * (float(miss) - self.target_miss_rate)
        self.updates += 1
        return miss


@dataclass
class AdaptiveConformalScale:
    """A multiplicative factor on a quantile forecast, updated after every outcome (ACI in log space).

    The same quantile-tracking update as :class:`AdaptiveConformalOffset`, on
    ``log(bound)`` instead of the bound::

        bound_t = forecast_t × exp(θ_t)
        θ_{t+1} = θ_t + γ · (miss_t − α)

    so the guarantee (realised miss rate → α while θ stays bounded) carries over.
    Why log space: TTFT spans 0.1 s to minutes across workloads and loads, and its
    errors are multiplicative (a queue mispredicted by 30 % is off by 30 % whatever
    its length); a step in seconds fitted on one workload would be too coarse or
    too slow on another, a dimensionless step is neither.

    Attributes:
        target_miss_rate: α in (0, 1) (0.1 for a P90 bound).
        step: γ, dimensionless (> 0): after a miss the bound grows by ``exp(γ (1 − α))``,
            after a hit it shrinks by ``exp(−γ α)``.
        log_scale: θ (starts at 0: the forecast itself).
        updates: outcomes seen so far.

    Raises:
        ValueError: ``target_miss_rate`` outside (0, 1) or ``step`` ≤ 0.
    """

    target_miss_rate: float = 0.1
    step: float = DEFAULT_SCALE_STEP
    log_scale: float = 0.0
    updates: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.target_miss_rate < 1:
            raise ValueError(f"target_miss_rate = {self.target_miss_rate}, expected a number in (0, 1)")
        if not self.step > 0:
            raise ValueError(f"step = {self.step}, expected a number > 0")

    @property
    def factor(self) -> float:
        """``exp(θ)``: what a forecast is multiplied by."""
        return math.exp(self.log_scale)

    def update(self, bound_s: float, observed_s: float) -> bool:
        """Score one outcome against the bound served for it; returns whether it was a miss."""
        miss = observed_s > bound_s
        self.log_scale += self.step * (float(miss) - self.target_miss_rate)
        self.updates += 1
        return miss
