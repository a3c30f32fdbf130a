"""Online learning inside the replay: scheduled retraining on the log so far, and drift monitoring.

The "scheduled retraining job" run on the replay's clock: the router starts
with the analytic model; every ``retrain_every_s`` of replay time, or as soon as
the completed requests reach ``min_rows`` and then each time they grow by
``rows_growth`` × (or sooner, when the drift monitor flags a worker or term),
the learner trains a new
:class:`~kvcost.models.term_set.TermModelSet` on every request completed so far
(the latest ``calibration_fraction`` of them calibrate it) and the router swaps
it in. Each completed request is also fed to a
:class:`~kvcost.calibration.drift.DriftMonitor` (peer reference: a worker's
rolling error against the other workers' over the same window, robust to the
trace's load swings) with the predictions made for it at decision time.
A policy with its own model (``RouterPolicy.own_model``: ``llmd_predicted_latency``)
is refitted on the same rows at the same moments instead of the term models.

A new set routes only if its composed TTFT predicts better than the set routing now
(:func:`mae_lower_beyond_noise`; kvcost issue 13 §4). With ``OnlineSettings.gate_on_replay``
(on by default) and where the replay supplies one (:attr:`OnlineLearner.window_replay`), the
sets in play are then also replayed on the latest window of completed requests, after a
warm-up, and must route it no worse in TTFT P50 and P99 (:func:`routes_no_worse`), the rule
``kvcost models promote --trace`` applies to champions (:mod:`kvcost.replay.promotion`). A live
log has no replay: there the MAE gate alone decides.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import pandas as pd

from kvcost.calibration.drift import DriftMonitor
from kvcost.data.log_rows import RequestRow
from kvcost.data.store import ACTUAL_COLUMNS, TERMS_AND_TTFT
from kvcost.features.spec import FEATURE_NAMES
from kvcost.models.shift import choice_shift_weights
from kvcost.models.term_set import TermModelSet
from kvcost.models.training import TimeSplit, feature_matrix, train_term_set
from kvcost.routing.policies import RouterPolicy

#: ``unchosen_features`` when none were kept (a replay that does not learn online keeps none).
NO_UNCHOSEN = np.empty((0, len(FEATURE_NAMES)))
#: Default length of the latest window a promotion is replayed on, seconds of trace time (half an hour
#: of traffic; the whole log so far on a shorter one).
DEFAULT_WINDOW_S = 1800.0
#: The latest window replayed with a model set: ``(model_set, now_s) → route_figures(…)`` of its
#: requests completed by ``now_s`` (:meth:`~kvcost.replay.simulator.ClusterSimulator.replay_window`).
WindowReplay = Callable[[TermModelSet, float], dict[str, float]]
#: Default warm-up of a replayed window, seconds of trace time before it: its arrivals are routed by the
#: same set but not measured, so the window starts with the queues and cache they leave behind rather
#: than on an empty cluster (:meth:`~kvcost.replay.simulator.ClusterSimulator.replay_window`). Ten
#: minutes: longer than the queue waits of every load measured here (P99 up to about 6 min in the
#: deepest overloads) and than a worker's cache turnover, a third of :data:`DEFAULT_WINDOW_S`.
DEFAULT_WARMUP_S = 600.0


class CompletedRequest(NamedTuple):
    """A measured request the replay completed: its ``requests`` row and what the learner needs beside it.

    A named tuple (immutable, typed): the replay builds one per request on its hot path.

    Attributes:
        row: the request's log row (predicted and actual terms, arrival, worker).
        features: float64 ``(len(FEATURE_NAMES),)``, the chosen candidate's feature row at decision time.
        p90_s: the calibrated P90 TTFT predicted at decision time, seconds (NaN when uncalibrated).
        finish_s: last token, replay seconds.
        unchosen_features: float64 ``(n_candidates − 1, len(FEATURE_NAMES))``, the feature rows of the
            candidates not chosen (the importance weights' reference, :mod:`kvcost.models.shift`).
    """

    row: RequestRow
    features: np.ndarray
    p90_s: float
    finish_s: float
    unchosen_features: np.ndarray = NO_UNCHOSEN


@dataclass(frozen=True, slots=True)
class OnlineSettings:
    """Online retraining configuration.

    Attributes:
        retrain_every_s: replay seconds between scheduled retrainings (> 0).
        predictor: term predictor name (``lightgbm`` by default).
        min_rows: completed requests needed before the first training (≥ 20).
        calibration_fraction: latest share of the rows used to calibrate, in (0, 1).
        retrain_on_drift: retrain at the next arrival when the drift monitor flags a
            worker's speed (``speed_ratio``: the model's prior for that worker is wrong),
            but not sooner than ``min_drift_interval_s`` after the last retraining.
            Error and coverage alerts are reported but do not retrain: the trace's load
            swings move them without the model being stale.
        min_drift_interval_s: replay seconds between drift-triggered retrainings (≥ 0).
        rows_growth: also retrain once the completed requests reach ``min_rows`` (the first
            training) and then this multiple of the last training's rows (> 1; ``inf`` = time
            schedule only). Why: a clock period suits one trace's span (300 s is 4 % of the
            bundled trace's 7,374 s, but longer than a whole generated workload of 5,000
            requests, 86–500 s, where the learned policies then never or once retrained:
            kvcost issue 13). A geometric schedule in rows holds on any span and rate: it
            retrains while each training doubles the data, and costs O(total rows) in all.
        importance_weighting: weight the training rows toward the distribution of every candidate
            the router ranked (:func:`~kvcost.models.shift.choice_shift_weights`), the remedy for a
            model trained only on its own choices.
        gate_on_mae: route with a newly trained set only if its composed TTFT has a lower MAE,
            beyond sampling noise, than the set routing now on the newest rows (the calibration
            slice, which no term model was fitted on); see :meth:`OnlineLearner.maybe_retrain`.
        gate_on_replay: then decide between the sets in play by replaying the latest
            ``replay_window_s`` of completed requests, after ``replay_warmup_s``, with each
            (:meth:`OnlineLearner._replay_gate`; where the learner has a
            :attr:`OnlineLearner.window_replay`; a live log has none). On by default: with
            the warm-up it brought ``learned_cost_aware`` closer to ``cost_aware`` where the MAE gate
            alone let worse-routing sets through, and kept both README fleet gains; without it, it
            lost one (``docs/routing-sensitivity.md``, "The replay gate again, after a warm-up").
        replay_window_s: that window, seconds of trace time (> 0).
        replay_warmup_s: seconds of trace time before the window replayed as its warm-up, routed
            by the same set and not measured (≥ 0; :data:`DEFAULT_WARMUP_S`).
    """

    retrain_every_s: float = 300.0
    predictor: str = "lightgbm"
    min_rows: int = 500
    calibration_fraction: float = 0.2
    retrain_on_drift: bool = True
    min_drift_interval_s: float = 120.0
    rows_growth: float = 2.0
    importance_weighting: bool = True
    gate_on_mae: bool = True
    gate_on_replay: bool = True
    replay_window_s: float = DEFAULT_WINDOW_S
    replay_warmup_s: float = DEFAULT_WARMUP_S

    def __post_init__(self) -> None:
        if not self.retrain_every_s > 0:
            raise ValueError(f"retrain_every_s = {self.retrain_every_s}, expected a number > 0")
        if self.min_rows < 20:
            raise ValueError(f"min_rows = {self.min_rows}, expected an integer ≥ 20")
        if not 0 < self.calibration_fraction < 1:
            raise ValueError(f"calibration_fraction = {self.calibration_fraction}, expected a number in (0, 1)")
        if not self.rows_growth > 1:
            raise ValueError(f"rows_growth = {self.rows_growth}, expected a number > 1 (inf: time schedule only)")
        if not self.replay_window_s > 0:
            raise ValueError(f"replay_window_s = {self.replay_window_s}, expected seconds > 0")
        if not self.replay_warmup_s >= 0:
            raise ValueError(f"replay_warmup_s = {self.replay_warmup_s}, expected seconds ≥ 0")


@dataclass
class OnlineLearner:
    """Retraining schedule, drift monitor and their history for one replay.

    ``observe`` is called for each completed request, ``maybe_retrain`` before each
    routing decision; it returns a new model set when it retrained, else None.
    ``routing_model`` is the set the gate last handed the router (None: the analytic model, as
    at the start). ``window_replay`` replays the latest window with a set, for the replay gate
    (None: the MAE gate alone, as on a live log without block hashes or an engine profile).
    """

    settings: OnlineSettings
    monitor: DriftMonitor = field(default_factory=lambda: DriftMonitor(reference="peers"))
    next_retrain_s: float = 0.0
    retrains: list[dict] = field(default_factory=list)
    alerts: list[dict] = field(default_factory=list)
    routing_model: TermModelSet | None = None
    window_replay: WindowReplay | None = None
    _seen: int = 0
    _drift_pending: bool = False

    def __post_init__(self) -> None:
        self.next_retrain_s = self.settings.retrain_every_s

    def observe(self, observations: list[CompletedRequest], now_s: float) -> None:
        """Feed newly completed requests (``observations`` from the first not yet seen on) to the drift monitor."""
        for o in observations[self._seen :]:
            predicted = {t: float(v) for t, v in zip(TERMS_AND_TTFT, o.row.predicted_s, strict=True)}
            measured = {t: float(v) for t, v in zip(TERMS_AND_TTFT, o.row.actual_s, strict=True)}
            p90_s = None if np.isnan(o.p90_s) else o.p90_s
            self.monitor.observe(o.row.worker_id, now_s, predicted, measured, p90_s)
        self._seen = len(observations)
        for alert in self.monitor.check(now_s):
            self._drift_pending |= alert.metric == "speed_ratio"
            self.alerts.append(
                {
                    "t_s": now_s,
                    "worker_id": alert.worker_id,
                    "term": alert.term,
                    "metric": alert.metric,
                    "value": alert.value,
                    "message": alert.message,
                }
            )

    def maybe_retrain(
        self, observations: list[CompletedRequest], now_s: float, policy: RouterPolicy | None = None
    ) -> TermModelSet | None:
        """Retrain when the schedule or a drift alert says so and enough rows exist.

        With ``gate_on_mae`` the set routing now (the incumbent: the analytic model before any
        set routed) stays unless a contender, the new set (the challenger) or the analytic model,
        has a lower mean absolute error of the composed TTFT, the quantity the cost-aware policies
        rank by, on the newest rows (the calibration slice: no term model was fitted on them), and
        lower beyond sampling noise (:func:`mae_lower_beyond_noise`); of such contenders the lower
        MAE routes. When the analytic model wins, the router gets the analytic terms with their
        TTFT calibrated on the same slice (served P90 bounds; the ranking is the analytic one).
        Each retraining records ``promoted`` (``challenger``, ``analytic`` or ``current``) and the
        MAEs (``mae_s``).

        Why a gate, and why MAE: a model trained on a short, biased log (its own choices, the first
        hundreds of requests of a workload) can rank worse than the profile it refines; without the
        gate ``learned_cost_aware`` was up to 1.15× ``cost_aware``'s TTFT P99 in the low-load cells
        of kvcost issue 13's grid, where the analytic terms are already close
        (``docs/routing-unseen-workloads.md``). The error of the chosen candidates' TTFT is the one
        figure a live fleet also has (only the chosen candidate's outcome is ever seen), so the
        gate works there too: it is :func:`~kvcost.models.mlflow_store.promote`'s MAE gate (champion
        against challenger; the analytic model when there is no champion), with the analytic model
        always a contender. Nothing in it is fitted to a workload.

        With ``gate_on_replay`` and a :attr:`window_replay`, the MAE gate's choice is then checked
        by replay (:meth:`_replay_gate`): the latest window of completed requests is replayed, after
        its warm-up, with each set in play (same arrivals, same seed), and the incumbent stays
        unless another routes it no worse in TTFT P50 and P99 (``promoted`` names the set that
        routes, ``refused`` the MAE gate's choice when it lost; ``replay`` holds the figures). Why:
        a lower MAE does not make a better router. A set trained on shorter queues than the ones
        it meets can predict the common case better and rank the overloaded workers worse (a
        held-out deep overload, A100-80GB × Llama-2-7B ``gen:mix`` at 95 %: 1.19× ``cost_aware``
        with the MAE gate alone, level with the replay gate). Why it should hold on other
        workloads: it compares routing outcomes, the figures the router is judged by, on the
        workload's own latest traffic, and the incumbent keeps ties; nothing is fitted. Stop 35
        replayed the window from an empty cluster, and it did not predict the run it was cut from
        (``docs/routing-unseen-workloads.md``); the warm-up gives the window the queues and cache
        the set would have built.

        Returns:
            The set to route with from now on, or None when it did not retrain, when the set routing
            now stays, or when ``policy`` has its own model (``policy.own_model``: then the policy is
            refitted on the same rows instead).
        """
        drift = (
            self.settings.retrain_on_drift
            and self._drift_pending
            and bool(self.retrains)
            and now_s >= self.retrains[-1]["t_s"] + self.settings.min_drift_interval_s
        )
        last_rows = self.retrains[-1]["rows"] if self.retrains else 0
        growth = self.settings.rows_growth
        grown = math.isfinite(growth) and len(observations) >= max(self.settings.min_rows, growth * last_rows)
        if (now_s < self.next_retrain_s and not drift and not grown) or len(observations) < self.settings.min_rows:
            return None
        frame = observations_frame(observations)
        record = {
            "t_s": now_s,
            "rows": len(frame),
            "trigger": "drift" if drift else "schedule" if now_s >= self.next_retrain_s else "rows",
        }
        model_set = None
        if policy is not None and policy.own_model:
            policy.fit_own_model(frame)
        else:
            n_calib = max(10, int(len(frame) * self.settings.calibration_fraction))
            split = TimeSplit(frame.iloc[:-n_calib], frame.iloc[-n_calib:], frame.iloc[:0])
            weights = self._weights(observations[: len(split.train)]) if self.settings.importance_weighting else None
            model_set = train_term_set(split, self.settings.predictor, weights)
            if self.settings.gate_on_mae:
                model_set = self._gate(model_set, split, record)
        self.monitor.reset_retrain_flag()
        self._drift_pending = False
        self.retrains.append(record)
        self.next_retrain_s = now_s + self.settings.retrain_every_s
        return model_set

    def _gate(self, challenger: TermModelSet, split: TimeSplit, record: dict) -> TermModelSet | None:
        """The set to route with after the MAE and replay gates (None: the set routing now stays); fills ``record``."""
        x = feature_matrix(split.calibration)
        actual_s = split.calibration["actual_ttft_s"].to_numpy()
        contenders = {"challenger": challenger, "analytic": TermModelSet.analytic()}
        if self.routing_model is not None:
            contenders["current"] = self.routing_model
        errors_s = {name: np.abs(m.predict(x).ttft_s - actual_s) for name, m in contenders.items()}
        mae_s = {name: float(e.mean()) for name, e in errors_s.items()}
        incumbent = "current" if "current" in contenders else "analytic"
        better = [
            name
            for name in contenders
            if name != incumbent and mae_lower_beyond_noise(errors_s[name], errors_s[incumbent])
        ]
        winner = min(better, key=mae_s.__getitem__) if better else incumbent
        record.update(promoted=winner, mae_s=mae_s)
        replay = self.settings.gate_on_replay and self.window_replay is not None
        if winner == "analytic" or replay:  # the analytic set routes with its TTFT calibrated on these rows
            contenders["analytic"] = train_term_set(split, "analytic")
        if replay:
            winner = self._replay_gate(contenders, incumbent, winner, record)
        if winner == "current":
            return None
        self.routing_model = contenders[winner]
        return self.routing_model

    def _replay_gate(self, contenders: dict[str, TermModelSet], incumbent: str, winner: str, record: dict) -> str:
        """The contender to route with after replaying the latest window with each in play; fills ``record``.

        In play: the incumbent, the MAE gate's ``winner``, and the analytic set whenever the
        incumbent is a learned set (routing must stay no worse than the analytic ranking, whose
        MAE is seldom lower). The incumbent stays unless another routes the window no worse in
        P50 and P99 (:func:`routes_no_worse`); of those, the lowest P99 (then P50) routes.
        """
        names = list(dict.fromkeys((incumbent, winner)))
        if contenders[incumbent].learned and "analytic" not in names:
            names.append("analytic")
        if len(names) == 1:
            return winner
        figures = {name: self.window_replay(contenders[name], record["t_s"]) for name in names}
        record["replay"] = figures
        no_worse = [name for name in names[1:] if routes_no_worse(figures[name], figures[incumbent])]
        choice = min(no_worse, key=lambda n: (figures[n]["ttft_p99_s"], figures[n]["ttft_p50_s"]), default=incumbent)
        if choice != winner:
            record["refused"] = winner
        record["promoted"] = choice
        return choice

    @staticmethod
    def _weights(observations: list[CompletedRequest]) -> np.ndarray:
        """Importance weights of these training rows against their requests' unchosen candidates."""
        chosen = np.vstack([o.features for o in observations])
        unchosen = np.vstack([o.unchosen_features for o in observations])
        return choice_shift_weights(chosen, unchosen)


def observations_frame(observations: list[CompletedRequest]) -> pd.DataFrame:
    """Training rows (FEATURE_NAMES, ``actual_*_s``, ``arrival_s``, ``worker_id``) in completion order."""
    features = np.vstack([o.features for o in observations])
    frame = pd.DataFrame(features, columns=list(FEATURE_NAMES))
    actual = np.array([o.row.actual_s for o in observations], dtype=np.float64)
    for i, name in enumerate(ACTUAL_COLUMNS):
        frame[name] = actual[:, i]
    frame["arrival_s"] = [o.row.arrival_s for o in observations]
    frame["worker_id"] = [o.row.worker_id for o in observations]
    return frame


#: One-sided normal quantile of :func:`mae_lower_beyond_noise` (95 %).
MAE_GATE_Z = 1.645


def mae_lower_beyond_noise(errors_s: np.ndarray, incumbent_errors_s: np.ndarray, z: float = MAE_GATE_Z) -> bool:
    """Whether a contender's absolute errors are lower than the incumbent's beyond sampling noise.

    A paired comparison on the same rows: with ``d = errors_s − incumbent_errors_s``, True when
    ``mean(d) + z × sd(d) ÷ √n < 0`` (the one-sided 95 % upper bound of the MAE difference is
    below 0; the paired z-test of the mean). Fewer than 2 rows: never.

    Why: the rows are the newest few hundred, and two models' MAEs on them differ by a few per cent
    by chance. Switching on such a difference swaps one ranking for another that is no better, and
    a replay then diverges from where the better-known model would have led it (kvcost issue 13:
    on ``gen:agent`` at 8 workers, 80 %, a challenger whose MAE was 0.0236 s against the analytic
    model's 0.0240 s routed for 60 s, and that cell's P99 was 3.5–5 % over ``cost_aware``'s on all
    three seeds). Consecutive rows' errors are correlated (they share queue states), so the bound
    is optimistic, if anything; nothing in it is fitted to a workload.

    Args:
        errors_s, incumbent_errors_s: absolute errors on the same rows, seconds, shape ``(n,)`` each.
        z: the normal quantile (> 0).

    Raises:
        ValueError: the shapes differ.
    """
    if errors_s.shape != incumbent_errors_s.shape:
        raise ValueError(
            f"errors_s has shape {errors_s.shape}, incumbent_errors_s {incumbent_errors_s.shape}: expected equal"
        )
    d = errors_s - incumbent_errors_s
    if len(d) < 2:
        return False
    return bool(d.mean() + z * d.std(ddof=1) / math.sqrt(len(d)) < 0)


def route_figures(ttft_s: np.ndarray) -> dict[str, float]:
    """The figures a routing gate compares: ``ttft_p50_s`` and ``ttft_p99_s`` of ``ttft_s`` (seconds, NaN skipped).

    NaN figures when no value is left (a window with no completed request).
    """
    ttft_s = ttft_s[~np.isnan(ttft_s)]
    if not ttft_s.size:
        return {"ttft_p50_s": math.nan, "ttft_p99_s": math.nan}
    return {"ttft_p50_s": float(np.quantile(ttft_s, 0.5)), "ttft_p99_s": float(np.quantile(ttft_s, 0.99))}


def routes_no_worse(new: dict[str, float], old: dict[str, float]) -> bool:
    """Whether ``new``'s TTFT P50 and P99 are each ≤ ``old``'s (:func:`route_figures` of one replay each).

    Ties pass: replays are seeded, so equal figures mean the same routing outcome. NaN (nothing
    to compare) fails, so the incumbent stays.
    """
    return new["ttft_p99_s"] <= old["ttft_p99_s"] and new["ttft_p50_s"] <= old["ttft_p50_s"]
