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

import heapq
import math
from collections import OrderedDict
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


#: Largest ``|θ|`` of :class:`AdaptiveConformalScale`: the factor stays within [1/100, 100].
MAX_LOG_SCALE = math.log(100.0)


@dataclass
class AdaptiveConformalScale:
    """A multiplicative factor on a quantile forecast, updated after every outcome (ACI in log space).

    The same quantile-tracking update as :class:`AdaptiveConformalOffset`, on
    ``log(bound)`` instead of the bound, each outcome scored against the bound that was served
    for it::

        bound_t = forecast_t × exp(θ_t)
        θ_{t+1} = clip(θ_t + γ · (miss_t − α), −MAX_LOG_SCALE, MAX_LOG_SCALE)

    so the guarantee (realised miss rate of the served bounds → α while θ stays inside the clip)
    carries over.

    Why the clip: outcomes arrive a TTFT after their decision. Under a burst, hundreds of
    decisions are served with the old factor before the first of them comes back, all of them
    misses, and ``θ`` integrates every one: kvcost issue 13 measured factors of 10^27–10^36 on
    generated workloads (bounds of 10^28 s, useless for the rest of the run, since each hit takes
    back only ``γα``). No TTFT forecast is off by more than a factor of 100 for long (a queue
    mispredicted that much is a model to retrain, which the drift monitor flags); within the clip
    the update is Gibbs & Candès's. Counting a request as a miss as soon as its bound has passed
    (:class:`ServedBounds`) shortens the delay itself. Scoring late outcomes against the current
    factor instead (no clip needed) was tried: it gave up the guarantee on the served bounds and
    covered less (84 % against 90 % on the bundled trace at 4 workers and 95 %; 44 % against 90 %
    on an overloaded shared-prefix workload).

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
        theta = self.log_scale + self.step * (float(miss) - self.target_miss_rate)
        self.log_scale = min(MAX_LOG_SCALE, max(-MAX_LOG_SCALE, theta))
        self.updates += 1
        return miss


#: Served bounds remembered for their outcome (:class:`ServedBounds`); the oldest are forgotten
#: beyond this (requests whose outcome never comes and whose bound is not yet passed).
MAX_PENDING_BOUNDS = 1 << 20


class ServedBounds:
    """The bounds served and not yet resolved, feeding an :class:`AdaptiveConformalScale`.

    Each routed request leaves the P90 bound it was served and its decision time. Its outcome
    updates the factor when its first token comes (:meth:`resolve`), or earlier: once a request
    has waited longer than its bound without a first token, it is a miss whatever its TTFT turns
    out to be, and :meth:`expire` counts it then (and its later outcome no more). Why: a TTFT is
    known only a TTFT after the decision, so under a queue that keeps growing, every outcome
    arrives a queue late and the factor lags the load by that much (kvcost issue 13 measured
    0.5 % served coverage on an overloaded generated workload, median TTFT 0.3 s, P99 27 s).
    A miss is certain as soon as the bound is passed, which bounds the lag by the bound itself
    rather than by the TTFT. Hits still wait for their outcome (a hit is not certain until the
    first token).

    A request whose outcome never comes (a rejected or unobserved one) is counted as a miss
    once its bound has passed: from the router's side it did not get a first token within it.

    Deadlines sit in a heap keyed by ``decided_s + bound_s``; an entry whose request was
    resolved is dropped when it comes due. O(log n) per request.

    Args:
        scale: the factor to update (shared with whoever serves bounds).
        max_pending: requests kept at most (≥ 1); the oldest are forgotten beyond it.
    """

    def __init__(self, scale: AdaptiveConformalScale, max_pending: int = MAX_PENDING_BOUNDS) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending = {max_pending}, expected an integer ≥ 1")
        self.scale = scale
        self.max_pending = max_pending
        self._pending: OrderedDict[int, tuple[float, float]] = OrderedDict()  # id → (decided_s, bound_s)
        self._deadlines: list[tuple[float, int]] = []

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, request_id: int, bound_s: float, decided_s: float) -> None:
        """Remember a served bound: ``bound_s`` (the P90 served, s, ≥ 0) served at ``decided_s``.
        A bound that is not finite (NaN: no bound; +inf: too few calibration rows) is not kept: it
        cannot be missed, and NaN has no place in the deadline order."""
        if not math.isfinite(bound_s):
            return
        self._pending[request_id] = (decided_s, bound_s)
        heapq.heappush(self._deadlines, (decided_s + bound_s, request_id))
        if len(self._pending) > self.max_pending:
            self._pending.popitem(last=False)

    def resolve(self, request_id: int, ttft_s: float) -> bool | None:
        """The request's first token came after ``ttft_s`` seconds: update the factor; returns whether
        it was a miss, or None when the request is unknown or was already counted."""
        entry = self._pending.pop(request_id, None)
        if entry is None:
            return None
        return self.scale.update(entry[1], ttft_s)

    def expire(self, now_s: float) -> int:
        """Count as misses the pending requests that have waited past their bound by ``now_s``;
        returns how many."""
        misses = 0
        while self._deadlines and self._deadlines[0][0] < now_s:
            _, request_id = heapq.heappop(self._deadlines)
            entry = self._pending.pop(request_id, None)
            if entry is not None:
                misses += self.scale.update(entry[1], now_s - entry[0])
        return misses
