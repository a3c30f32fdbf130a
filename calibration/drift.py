"""Drift monitor: rolling per-term error and P90 coverage per worker.

For every key ``(worker, term)``, with ``term`` one of :data:`TERMS` or
``"ttft"``, the monitor keeps the last ``window`` absolute errors
``|actual − predicted|`` (seconds) and, for ``"ttft"``, whether the actual TTFT
was at most its 90 % upper bound (:class:`~kvcost.calibration.conformal.SplitConformal`).
:meth:`DriftMonitor.check` compares them with their bands:

- ``"mae_ratio"``: rolling MAE ÷ reference MAE of the term; out of band when
  above ``mae_ratio_band`` (default 2.0). The reference is what the model
  achieved on its holdout, set per term by :meth:`DriftMonitor.set_reference`
  after training and shared by every worker. For a term without a reference,
  each key takes the MAE of its own first full window (its first ``window``
  observations) as its reference, so a worker is compared with its own early
  behaviour; until that window is full there is no ratio to check. A
  reference below ``mae_floor_s`` is raised to it, so a term that is predicted
  exactly (no transfer → 0 s predicted, 0 s actual) does not alert on
  microseconds of noise.
  With ``reference="peers"`` the reference of ``(worker, term)`` is instead the
  median rolling MAE of the *other* workers for that term (at least two with
  ``min_observations``): a worker is compared with its peers over the same
  window, so a load surge that raises every worker's error does not alert but a
  straggler does. Use it when the load is not stationary (replays of real traces).
- ``"speed_ratio"`` (``reference="peers"`` only, for ``bias_terms``, default
  ``("prefill",)``): the worker's median of actual ÷ predicted over its window,
  divided by the median of its peers' medians. A straggler at 60 % speed shows
  ≈ 1.67 on its prefill term whatever the request sizes, where an MAE swings
  with them. Out of band outside ``[1 / speed_ratio_band, speed_ratio_band]``
  (default 1.3).
- ``"coverage_90"``: share of actual TTFT ≤ the 90 % upper bound; out of band
  outside ``coverage_band`` (default (0.80, 0.97)). Too low means the bounds
  are optimistic; too high means they are wider than they need to be.

A key is only checked once it holds ``min_observations`` observations. An alert
fires when a key leaves its band and again only after a check has seen it back
inside (hysteresis: no repeated alerts while it stays out). Every alert raises
:attr:`DriftMonitor.should_retrain` until :meth:`DriftMonitor.reset_retrain_flag`.

No clock is read: times are passed in (``now_s``), in seconds on the caller's
clock.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Literal

from kvcost.data.store import TERMS_AND_TTFT

#: Keys the monitor tracks: every TTFT term plus the composed ``"ttft"``.
MONITORED_TERMS: tuple[str, ...] = TERMS_AND_TTFT

Metric = Literal["mae_ratio", "speed_ratio", "coverage_90"]

#: A worker whose speed is off its reference by more than this factor either way is a straggler (or
#: faster than thought): the ``speed_ratio`` alert's default band, and the band outside which the router's
#: near ties price a worker at its measured step time (:func:`kvcost.routing.policies.basic.prefill_s_per_token`).
SPEED_RATIO_BAND = 1.3

_TERM_ORDER = {term: i for i, term in enumerate(MONITORED_TERMS)}
#: Added to actual and predicted before their ratio so that 0 s terms stay finite, seconds.
_RATIO_EPS_S = 1e-3


@dataclass(frozen=True, slots=True)
class DriftAlert:
    """One key that left its band.

    Attributes:
        worker_id: the worker, as passed to :meth:`DriftMonitor.observe`.
        term: one of :data:`MONITORED_TERMS`.
        metric: ``"mae_ratio"`` (rolling MAE ÷ reference, dimensionless) or
            ``"coverage_90"`` (share of actual TTFT ≤ 90 % bound, in [0, 1]).
        value: the metric's value at the check.
        band: ``(low, high)`` inside which no alert fires (``(0.0, mae_ratio_band)``
            for ``"mae_ratio"``).
        window_start_s, window_end_s: ``now_s`` of the oldest and newest
            observation in the window, seconds.
        message: one line naming the worker, term, value, band and window.
    """

    worker_id: Hashable
    term: str
    metric: Metric
    value: float
    band: tuple[float, float]
    window_start_s: float
    window_end_s: float
    message: str


class _Rolling:
    """Last ``size`` values with their times and a running sum; O(1) amortised per push.

    The running sum is recomputed from the deque every ``size`` pushes so
    floating-point error cannot accumulate over a long stream.
    """

    __slots__ = ("times_s", "values", "total", "_pushes")

    def __init__(self, size: int) -> None:
        self.times_s: deque[float] = deque(maxlen=size)
        self.values: deque[float] = deque(maxlen=size)
        self.total = 0.0
        self._pushes = 0

    def push(self, now_s: float, value: float) -> None:
        if len(self.values) == self.values.maxlen:
            self.total -= self.values[0]
        self.times_s.append(now_s)
        self.values.append(value)
        self.total += value
        self._pushes += 1
        if self._pushes % self.values.maxlen == 0:
            self.total = math.fsum(self.values)

    def __len__(self) -> int:
        return len(self.values)

    @property
    def full(self) -> bool:
        return len(self.values) == self.values.maxlen

    @property
    def mean(self) -> float:
        return self.total / len(self.values)


class DriftMonitor:
    """Rolling error and coverage monitor per ``(worker, term)``.

    Args:
        window: observations kept per key, ≥ 1 (default 200).
        min_observations: observations a key needs before it is checked,
            1 ≤ ``min_observations`` ≤ ``window`` (default 50).
        mae_ratio_band: alert when rolling MAE > this × reference MAE, > 0 (default 2.0).
        coverage_band: ``(low, high)`` for the 90 % bound's coverage,
            0 ≤ low ≤ high ≤ 1 (default (0.80, 0.97)).
        mae_floor_s: smallest reference MAE used in the ratio, seconds, > 0
            (default 0.001 s).
        reference: ``"model"`` (the set or first-window reference, default) or
            ``"peers"`` (the median of the other workers' rolling MAE).
        bias_terms: terms whose speed ratio is checked in ``"peers"`` mode.
        speed_ratio_band: > 1; alert outside ``[1 / band, band]`` (default :data:`SPEED_RATIO_BAND`).

    Raises:
        ValueError: a config value out of range.

    Memory is O(workers × terms × window); :meth:`observe` is O(1) amortised per
    term; :meth:`check` is O(keys).

    Thread safety: not thread-safe; one owner (the retraining loop or the
    simulator) calls :meth:`observe` and :meth:`check`.
    """

    def __init__(
        self,
        window: int = 200,
        min_observations: int = 50,
        mae_ratio_band: float = 2.0,
        coverage_band: tuple[float, float] = (0.80, 0.97),
        mae_floor_s: float = 1e-3,
        reference: Literal["model", "peers"] = "model",
        bias_terms: tuple[str, ...] = ("prefill",),
        speed_ratio_band: float = SPEED_RATIO_BAND,
    ) -> None:
        if window < 1:
            raise ValueError(f"window must be ≥ 1 observation; got {window!r}")
        if not 1 <= min_observations <= window:
            raise ValueError(f"min_observations must be in [1, window={window}]; got {min_observations!r}")
        if not (math.isfinite(mae_ratio_band) and mae_ratio_band > 0.0):
            raise ValueError(f"mae_ratio_band must be finite and > 0; got {mae_ratio_band!r}")
        low, high = (float(x) for x in coverage_band)
        if not 0.0 <= low <= high <= 1.0:
            raise ValueError(f"coverage_band must satisfy 0 ≤ low ≤ high ≤ 1; got {coverage_band!r}")
        if not (math.isfinite(mae_floor_s) and mae_floor_s > 0.0):
            raise ValueError(f"mae_floor_s must be finite and > 0 seconds; got {mae_floor_s!r}")
        if reference not in ("model", "peers"):
            raise ValueError(f"reference must be 'model' or 'peers'; got {reference!r}")
        if not (math.isfinite(speed_ratio_band) and speed_ratio_band > 1.0):
            raise ValueError(f"speed_ratio_band must be finite and > 1; got {speed_ratio_band!r}")
        for term in bias_terms:
            _check_term(term, "bias_terms")
        self.reference = reference
        self.bias_terms = tuple(bias_terms)
        self.speed_ratio_band = float(speed_ratio_band)
        self._log_ratios: dict[tuple[Hashable, str], _Rolling] = {}
        self.window = int(window)
        self.min_observations = int(min_observations)
        self.mae_ratio_band = float(mae_ratio_band)
        self.coverage_band = (low, high)
        self.mae_floor_s = float(mae_floor_s)
        self._reference_mae_s: dict[str, float] = {}
        self._estimated_reference_s: dict[tuple[Hashable, str], float] = {}
        self._errors: dict[tuple[Hashable, str], _Rolling] = {}
        self._covered: dict[Hashable, _Rolling] = {}
        self._out_of_band: set[tuple[Hashable, str, Metric]] = set()
        self._alerts_total: dict[tuple[Hashable, str], int] = {}
        self._workers: dict[Hashable, int] = {}  # worker → first-observed order
        self._should_retrain = False
        self._last_check_s = -math.inf

    # -- configuration -------------------------------------------------------

    def set_reference(self, mae_by_term: Mapping[str, float]) -> None:
        """Set the reference MAE (seconds) of some terms, e.g. holdout MAE after training.

        Replaces the reference of the named terms for every worker (and any
        first-window estimate for them); other terms keep theirs.

        Raises:
            ValueError: an unknown term, or a value not finite and ≥ 0.
        """
        for term, mae_s in mae_by_term.items():
            _check_term(term, "mae_by_term")
            if not (math.isfinite(mae_s) and mae_s >= 0.0):
                raise ValueError(f"mae_by_term[{term!r}] must be finite and ≥ 0 seconds; got {mae_s!r}")
        for term, mae_s in mae_by_term.items():
            self._reference_mae_s[term] = float(mae_s)

    def reference_mae_s(self, worker_id: Hashable, term: str) -> float | None:
        """The reference MAE used for ``(worker_id, term)``, seconds, or None when not known yet."""
        if self.reference == "peers":
            return self._peer_reference_s(worker_id, term)
        if term in self._reference_mae_s:
            return self._reference_mae_s[term]
        return self._estimated_reference_s.get((worker_id, term))

    def _peer_reference_s(self, worker_id: Hashable, term: str) -> float | None:
        peers = sorted(
            errors.mean
            for (other, other_term), errors in self._errors.items()
            if other_term == term and other != worker_id and len(errors) >= self.min_observations
        )
        if len(peers) < 2:
            return None
        mid = len(peers) // 2
        return peers[mid] if len(peers) % 2 else 0.5 * (peers[mid - 1] + peers[mid])

    # -- data ----------------------------------------------------------------

    def observe(
        self,
        worker_id: Hashable,
        now_s: float,
        predicted: Mapping[str, float],
        actual: Mapping[str, float],
        ttft_upper90_s: float | None = None,
    ) -> None:
        """Record one finished request served by ``worker_id``.

        Args:
            worker_id: any hashable worker id (used in alert messages as ``worker {id}``).
            now_s: the time of the observation, seconds (the window's time span is
                taken from these values).
            predicted, actual: term → seconds, keys from :data:`MONITORED_TERMS`;
                terms present in both are recorded, others are skipped (a term that
                was not logged). Values finite and ≥ 0.
            ttft_upper90_s: the 90 % upper bound that was served for this request,
                seconds (≥ 0, ``+inf`` allowed), or None when there was none; needs
                ``actual["ttft"]``.

        Raises:
            ValueError: an unknown term, a value out of range, or ``ttft_upper90_s``
                without ``actual["ttft"]``. Nothing is recorded when it raises.
        """
        now_s = _finite(now_s, "now_s")
        for name, values in (("predicted", predicted), ("actual", actual)):
            for term, value in values.items():
                _check_term(term, name)
                if not (math.isfinite(value) and value >= 0.0):
                    raise ValueError(f"{name}[{term!r}] must be finite and ≥ 0 seconds; got {value!r}")
        if ttft_upper90_s is not None:
            if "ttft" not in actual:
                raise ValueError("ttft_upper90_s given but actual has no 'ttft'")
            if math.isnan(ttft_upper90_s) or ttft_upper90_s < 0.0:
                raise ValueError(f"ttft_upper90_s must be ≥ 0 seconds (or +inf); got {ttft_upper90_s!r}")

        self._workers.setdefault(worker_id, len(self._workers))
        for term, pred_s in predicted.items():
            if term not in actual:
                continue
            key = (worker_id, term)
            errors = self._errors.get(key)
            if errors is None:
                errors = self._errors[key] = _Rolling(self.window)
            errors.push(now_s, abs(float(actual[term]) - float(pred_s)))
            if self.reference == "peers" and term in self.bias_terms:
                ratios = self._log_ratios.get(key)
                if ratios is None:
                    ratios = self._log_ratios[key] = _Rolling(self.window)
                ratios.push(now_s, math.log((float(actual[term]) + _RATIO_EPS_S) / (float(pred_s) + _RATIO_EPS_S)))
            if errors.full and term not in self._reference_mae_s and key not in self._estimated_reference_s:
                self._estimated_reference_s[key] = errors.mean
        if ttft_upper90_s is not None:
            covered = self._covered.get(worker_id)
            if covered is None:
                covered = self._covered[worker_id] = _Rolling(self.window)
            covered.push(now_s, 1.0 if actual["ttft"] <= ttft_upper90_s else 0.0)

    # -- checking ------------------------------------------------------------

    def check(self, now_s: float) -> list[DriftAlert]:
        """Alerts for keys that left their band since the last check.

        Args:
            now_s: time of the check, seconds; must not go back before a previous check.

        Returns:
            New alerts, ordered by worker (in first-observed order), then term in
            :data:`MONITORED_TERMS` order, then metric; empty when nothing changed.

        Raises:
            ValueError: ``now_s`` not finite or earlier than the previous check.
        """
        now_s = _finite(now_s, "now_s")
        if now_s < self._last_check_s:
            raise ValueError(f"now_s went backwards: {now_s} < previous check at {self._last_check_s}")
        self._last_check_s = now_s
        alerts: list[DriftAlert] = []
        for (worker_id, term), errors in self._errors.items():
            if len(errors) < self.min_observations:
                continue
            reference_s = self.reference_mae_s(worker_id, term)
            if reference_s is None:
                continue
            ratio = errors.mean / max(reference_s, self.mae_floor_s)
            band = (0.0, self.mae_ratio_band)
            message = (
                f"worker {worker_id} {term}: rolling MAE {ratio:.2f}× reference (band ≤ {band[1]:.1f}×)"
                f" over {errors.times_s[0]:.1f}–{errors.times_s[-1]:.1f} s"
            )
            self._transition(alerts, worker_id, term, "mae_ratio", ratio, band, ratio > band[1], errors, message)
        self._check_speed(alerts)
        for worker_id, covered in self._covered.items():
            if len(covered) < self.min_observations:
                continue
            share = covered.mean
            low, high = self.coverage_band
            message = (
                f"worker {worker_id} ttft: P90 coverage {100 * share:.1f} % (band {100 * low:.1f}–{100 * high:.1f} %)"
                f" over {covered.times_s[0]:.1f}–{covered.times_s[-1]:.1f} s"
            )
            outside = share < low or share > high
            self._transition(alerts, worker_id, "ttft", "coverage_90", share, (low, high), outside, covered, message)
        alerts.sort(key=lambda a: (self._workers[a.worker_id], _TERM_ORDER[a.term], a.metric != "mae_ratio"))
        return alerts

    def _check_speed(self, alerts: list[DriftAlert]) -> None:
        medians = {
            key: statistics.median(ratios.values)
            for key, ratios in self._log_ratios.items()
            if len(ratios) >= self.min_observations
        }
        band = (1.0 / self.speed_ratio_band, self.speed_ratio_band)
        for (worker_id, term), own in medians.items():
            peers = [m for (other, other_term), m in medians.items() if other_term == term and other != worker_id]
            if len(peers) < 2:
                continue
            ratio = math.exp(own - statistics.median(peers))
            rolling = self._log_ratios[(worker_id, term)]
            message = (
                f"worker {worker_id} {term}: actual/predicted {ratio:.2f}× its peers' "
                f"(band {band[0]:.2f}–{band[1]:.2f}×) over {rolling.times_s[0]:.1f}–{rolling.times_s[-1]:.1f} s"
            )
            outside = not band[0] <= ratio <= band[1]
            self._transition(alerts, worker_id, term, "speed_ratio", ratio, band, outside, rolling, message)

    def _transition(
        self,
        alerts: list[DriftAlert],
        worker_id: Hashable,
        term: str,
        metric: Metric,
        value: float,
        band: tuple[float, float],
        outside: bool,
        rolling: _Rolling,
        message: str,
    ) -> None:
        """Fire on an inside → outside transition; re-arm on outside → inside."""
        state = (worker_id, term, metric)
        if not outside:
            self._out_of_band.discard(state)
            return
        if state in self._out_of_band:
            return
        self._out_of_band.add(state)
        self._alerts_total[(worker_id, term)] = self._alerts_total.get((worker_id, term), 0) + 1
        self._should_retrain = True
        alerts.append(
            DriftAlert(
                worker_id=worker_id,
                term=term,
                metric=metric,
                value=value,
                band=band,
                window_start_s=rolling.times_s[0],
                window_end_s=rolling.times_s[-1],
                message=message,
            )
        )

    # -- outputs -------------------------------------------------------------

    @property
    def alerts_total(self) -> dict[tuple[Hashable, str], int]:
        """Alerts fired so far per ``(worker_id, term)`` (both metrics), a copy; for a Prometheus counter."""
        return dict(self._alerts_total)

    @property
    def should_retrain(self) -> bool:
        """True when any alert fired since construction or the last :meth:`reset_retrain_flag`."""
        return self._should_retrain

    def reset_retrain_flag(self) -> None:
        """Clear :attr:`should_retrain` (call when a retraining job starts). Band states are kept."""
        self._should_retrain = False


def _check_term(term: str, where: str) -> None:
    if term not in MONITORED_TERMS:
        raise ValueError(f"unknown term {term!r} in {where}; expected one of: {', '.join(MONITORED_TERMS)}")


def _finite(value: float, name: str) -> float:
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite seconds; got {value!r}")
    return value
