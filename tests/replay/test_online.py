import math
from dataclasses import replace

import numpy as np
import pytest

from kvcost.data.log_rows import RequestRow
from kvcost.features.spec import FEATURE_INDEX, FEATURE_NAMES
from kvcost.models.term_set import TermModelSet
from kvcost.replay.config import ClusterConfig
from kvcost.replay.online import (
    CompletedRequest,
    OnlineLearner,
    OnlineSettings,
    mae_lower_beyond_noise,
    observations_frame,
    route_figures,
    routes_no_worse,
)
from kvcost.replay.simulator import ClusterSimulator, latest_window
from kvcost.routing.policies.llmd_latency import LlmdPredictedLatencyPolicy
from kvcost.routing.router import RouterSettings
from tests.replay.test_simulator import blocks, make_trace


def _observations(n, t0=0.0, slow_worker=None, profile_error=1.5):
    """``n`` completed requests: prefill takes ``profile_error`` × its nominal time (2 × more on ``slow_worker``)."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        features = np.zeros(len(FEATURE_NAMES))
        features[FEATURE_INDEX["nominal_prefill_s"]] = prefill = rng.uniform(0.5, 1.0)
        worker = i % 4
        actual_prefill = prefill * profile_error * (2.0 if worker == slow_worker else 1.0)
        actual = (0.0, 0.0, 0.0, actual_prefill, 0.0, actual_prefill)
        predicted = (0.0, 0.0, 0.0, prefill, 0.0, prefill)
        row = RequestRow(i, t0 + i, worker, 100, 10, 0, 0, predicted, actual)
        out.append(CompletedRequest(row, features, np.nan, t0 + i))
    return out


def test_schedule_and_minimum_rows():
    learner = OnlineLearner(OnlineSettings(retrain_every_s=100, min_rows=50))
    assert learner.maybe_retrain(_observations(40), now_s=150) is None  # too few rows
    model_set = learner.maybe_retrain(_observations(60), now_s=150)
    assert model_set is not None and model_set.learned
    assert [{k: r[k] for k in ("t_s", "rows", "trigger")} for r in learner.retrains] == [
        {"t_s": 150, "rows": 60, "trigger": "schedule"}
    ]
    assert learner.maybe_retrain(_observations(80), now_s=200) is None  # next at 250
    assert learner.next_retrain_s == 250


def test_rows_growth_retrains_each_time_the_rows_double():
    learner = OnlineLearner(OnlineSettings(retrain_every_s=1000, min_rows=50))
    assert learner.maybe_retrain(_observations(60), now_s=10) is not None  # min_rows reached, long before 1000 s
    assert learner.maybe_retrain(_observations(119), now_s=20) is None  # 2 × 60 = 120 needed
    learner.maybe_retrain(_observations(120), now_s=30)
    triggers = [(r["t_s"], r["rows"], r["trigger"]) for r in learner.retrains]
    assert triggers == [(10, 60, "rows"), (30, 120, "rows")]
    clock_only = OnlineLearner(OnlineSettings(retrain_every_s=1000, min_rows=50, rows_growth=math.inf))
    assert clock_only.maybe_retrain(_observations(500), now_s=999) is None


def test_straggler_alert_triggers_an_early_retrain():
    learner = OnlineLearner(OnlineSettings(retrain_every_s=1000, min_rows=50, min_drift_interval_s=10))
    healthy = _observations(400)
    learner.observe(healthy, now_s=400)
    assert learner.maybe_retrain(healthy, now_s=1000) is not None  # first, scheduled
    drifted = healthy + _observations(400, t0=1000, slow_worker=2)
    learner.observe(drifted, now_s=1400)
    speed = [a for a in learner.alerts if a["metric"] == "speed_ratio"]
    assert [a["worker_id"] for a in speed] == [2]
    assert learner.maybe_retrain(drifted, now_s=1400) is not None
    assert learner.retrains[-1]["trigger"] == "drift"


def test_observations_frame_columns():
    frame = observations_frame(_observations(3))
    assert list(frame.columns[: len(FEATURE_NAMES)]) == list(FEATURE_NAMES)
    assert frame["actual_prefill_s"].tolist() == pytest.approx((1.5 * frame["nominal_prefill_s"]).tolist())
    assert frame["worker_id"].tolist() == [0, 1, 2]


def test_settings_validation():
    with pytest.raises(ValueError, match="retrain_every_s = 0, expected a number > 0"):
        OnlineSettings(retrain_every_s=0)
    with pytest.raises(ValueError, match="min_rows = 5"):
        OnlineSettings(min_rows=5)
    with pytest.raises(ValueError, match=r"rows_growth = 1, expected a number > 1 \(inf: time schedule only\)"):
        OnlineSettings(rows_growth=1)
    with pytest.raises(ValueError, match="replay_window_s = 0, expected seconds > 0"):
        OnlineSettings(replay_window_s=0)
    with pytest.raises(ValueError, match="replay_warmup_s = -1, expected seconds ≥ 0"):
        OnlineSettings(replay_warmup_s=-1)


def test_a_policy_with_its_own_model_is_refitted_instead_of_the_term_models():
    policy = LlmdPredictedLatencyPolicy()
    learner = OnlineLearner(OnlineSettings(retrain_every_s=100, min_rows=50))
    assert learner.maybe_retrain(_observations(60), now_s=150, policy=policy) is None
    assert policy.model.fitted and policy.model.rows == 60
    assert learner.retrains == [{"t_s": 150, "rows": 60, "trigger": "schedule"}]


def test_the_replay_teaches_llmd_predicted_latency_online():
    trace = make_trace([(0.25 * i, 600, 4, blocks(range(1, 11), 100 * (i + 1), 600)) for i in range(80)])
    config = ClusterConfig(fleet=("a100", "a100"), router=RouterSettings(policy="llmd_predicted_latency"))
    sim = ClusterSimulator(config, trace.block_size_tokens, online=OnlineSettings(retrain_every_s=10, min_rows=20))
    result = sim.run(trace)
    policy = sim.router.policy
    assert {r["trigger"] for r in result.retrains} <= {"rows", "schedule"} and result.retrains
    assert policy.model.fitted and policy.model.rows == result.retrains[-1]["rows"]
    assert sim.router.cost_model.learned is False  # the router's term models stay analytic
    assert policy.aci.updates > 0  # first tokens of requests routed by the fitted model were scored


def test_served_coverage_counts_every_request_routed_after_the_first_training():
    trace = make_trace([(0.25 * i, 600, 4, blocks(range(1, 11), 100 * (i + 1), 600)) for i in range(80)])
    config = ClusterConfig(fleet=("a100", "a100"), router=RouterSettings(policy="learned_cost_aware"))
    online = OnlineSettings(retrain_every_s=1000, min_rows=20)
    result = ClusterSimulator(config, trace.block_size_tokens, online=online).run(trace)
    first_s = result.retrains[0]["t_s"]
    served = result.served_coverage_90
    assert served["requests"] == int((result.requests["arrival_s"] >= first_s).sum()) > 0
    assert 0.0 <= served["coverage"] <= 1.0
    analytic = ClusterSimulator(replace(config, router=RouterSettings()), trace.block_size_tokens).run(trace)
    assert analytic.served_coverage_90 is None


def test_training_rows_are_weighted_against_their_unchosen_candidates():
    chosen = _observations(60)
    rng = np.random.default_rng(1)
    others = []
    for o in chosen:  # each request had 3 rejected candidates, with longer predicted prefills
        unchosen = np.zeros((3, len(FEATURE_NAMES)))
        unchosen[:, FEATURE_INDEX["nominal_prefill_s"]] = rng.uniform(0.5, 3.0, 3)
        others.append(o._replace(unchosen_features=unchosen))
    weighted = OnlineLearner(OnlineSettings(min_rows=50)).maybe_retrain(others, now_s=10)
    rows = weighted.metadata["importance_weights"]
    assert 0 < rows["effective_rows"] < 48 and rows["max_weight"] > 1  # 48 training rows, unequal weights
    plain = OnlineLearner(OnlineSettings(min_rows=50, importance_weighting=False)).maybe_retrain(others, now_s=10)
    assert "importance_weights" not in plain.metadata


def test_the_gate_routes_with_the_analytic_model_where_it_predicts_better():
    learner = OnlineLearner(OnlineSettings(retrain_every_s=100, min_rows=50))
    model_set = learner.maybe_retrain(_observations(60, profile_error=1.0), now_s=150)
    record = learner.retrains[-1]
    assert record["promoted"] == "analytic" and record["mae_s"] == {"challenger": 0.0, "analytic": 0.0}  # a tie
    assert not model_set.learned and model_set.calibrated  # analytic terms, TTFT calibrated on the newest rows


def test_the_gate_promotes_a_challenger_that_predicts_better_and_keeps_a_better_current_set():
    learner = OnlineLearner(OnlineSettings(retrain_every_s=100, min_rows=50))
    model_set = learner.maybe_retrain(_observations(400), now_s=150)  # the profile is 1.5× off
    record = learner.retrains[-1]
    assert record["promoted"] == "challenger" and model_set.learned and learner.routing_model is model_set
    assert record["mae_s"]["challenger"] < 0.01 < 0.3 < record["mae_s"]["analytic"]
    assert learner.maybe_retrain(_observations(60), now_s=300) is None  # 48 training rows only: worse
    record = learner.retrains[-1]
    assert record["promoted"] == "current" and sorted(record["mae_s"]) == ["analytic", "challenger", "current"]
    assert record["mae_s"]["current"] < record["mae_s"]["challenger"] and learner.routing_model is model_set


@pytest.mark.parametrize(
    ("errors_s", "incumbent_errors_s", "z", "lower"),
    [
        ([0.1, 0.2, 0.3, 0.4], [1.1, 1.2, 1.3, 1.4], 1.645, True),  # 1 s lower on every row: no spread
        ([0.1, 0.3], [0.2, 0.2], 1.645, False),  # the same MAE
        # d = (−0.2, 0, −0.1, −0.1): mean −0.1, sd √(0.02 / 3) = 0.0816, upper bound −0.1 + z × 0.0408
        ([0.0, 0.2, 0.1, 0.1], [0.2, 0.2, 0.2, 0.2], 1.645, True),  # −0.033 < 0
        ([0.0, 0.2, 0.1, 0.1], [0.2, 0.2, 0.2, 0.2], 3.0, False),  # +0.022
        ([0.0], [5.0], 1.645, False),  # one row says nothing of the noise
    ],
)
def test_mae_lower_beyond_noise_by_hand(errors_s, incumbent_errors_s, z, lower):
    assert mae_lower_beyond_noise(np.array(errors_s), np.array(incumbent_errors_s), z) is lower


def test_mae_lower_beyond_noise_refuses_rows_that_do_not_pair():
    with pytest.raises(ValueError, match=r"errors_s has shape \(2,\), incumbent_errors_s \(3,\)"):
        mae_lower_beyond_noise(np.zeros(2), np.zeros(3))


def test_without_the_gate_every_challenger_routes():
    learner = OnlineLearner(OnlineSettings(retrain_every_s=100, min_rows=50, gate_on_mae=False))
    model_set = learner.maybe_retrain(_observations(60, profile_error=1.0), now_s=150)
    assert model_set.learned and "promoted" not in learner.retrains[-1]


def _figures(p50_s, p99_s):
    return {"ttft_p50_s": p50_s, "ttft_p99_s": p99_s}


def _gated_learner(figures, calls):
    """A learner whose window replay answers ``figures[set.learned]`` (True: a learned set, False: analytic)."""

    def window_replay(model_set, now_s):
        calls.append((model_set.learned, now_s))
        return figures[model_set.learned]

    settings = OnlineSettings(retrain_every_s=100, min_rows=50, gate_on_replay=True)
    return OnlineLearner(settings, window_replay=window_replay)


def test_the_replay_gate_refuses_a_challenger_that_routes_the_window_worse():
    calls = []
    learner = _gated_learner({True: _figures(1.0, 9.5), False: _figures(1.0, 9.0)}, calls)
    model_set = learner.maybe_retrain(_observations(400), now_s=150)  # the challenger wins the MAE gate
    record = learner.retrains[-1]
    assert calls == [(False, 150), (True, 150)]  # the incumbent's window (analytic), then the challenger's
    assert record["promoted"] == "analytic" and record["refused"] == "challenger"
    assert record["replay"] == {"analytic": _figures(1.0, 9.0), "challenger": _figures(1.0, 9.5)}
    assert not model_set.learned and model_set.calibrated and learner.routing_model is model_set


def test_the_replay_gate_passes_a_challenger_no_worse_and_puts_the_analytic_set_back_when_it_routes_better():
    calls = []
    figures = {True: _figures(1.0, 9.0), False: _figures(1.0, 9.0)}  # a tie passes
    learner = _gated_learner(figures, calls)
    challenger = learner.maybe_retrain(_observations(400), now_s=150)
    assert learner.retrains[-1]["promoted"] == "challenger" and "refused" not in learner.retrains[-1]
    assert challenger.learned and learner.routing_model is challenger
    figures[False] = _figures(1.0, 8.0)  # the MAE gate keeps the learned set; the analytic one routes better
    model_set = learner.maybe_retrain(_observations(60), now_s=300)
    record = learner.retrains[-1]
    assert calls[2:] == [(True, 300), (False, 300)]  # the learned incumbent, then the analytic set
    assert record["promoted"] == "analytic" and record["refused"] == "current"
    assert not model_set.learned and learner.routing_model is model_set
    learner.maybe_retrain(_observations(60, profile_error=1.0), now_s=450)  # analytic incumbent, MAE keeps it
    assert len(calls) == 4 and "replay" not in learner.retrains[-1]  # nothing else in play: no replay


def test_the_replay_gate_is_on_by_default_and_can_be_turned_off():
    assert OnlineSettings().gate_on_replay and OnlineSettings().replay_warmup_s == 600.0
    calls = []
    off = OnlineLearner(OnlineSettings(min_rows=50, gate_on_replay=False), window_replay=lambda m, t: calls.append(m))
    assert off.maybe_retrain(_observations(400), now_s=150).learned and calls == []


@pytest.mark.parametrize(
    ("new", "old", "passed"),
    [
        ((1.0, 9.0), (1.0, 9.0), True),  # equal: the same routing outcome
        ((0.9, 8.0), (1.0, 9.0), True),
        ((1.1, 8.0), (1.0, 9.0), False),  # a better tail bought with the median
        ((0.9, 9.1), (1.0, 9.0), False),
        ((math.nan, math.nan), (1.0, 9.0), False),  # an empty window: nothing to compare
    ],
)
def test_routes_no_worse_by_hand(new, old, passed):
    assert routes_no_worse(_figures(*new), _figures(*old)) is passed


def test_route_figures_by_hand():
    # numpy's linear quantile of 0, 1, …, 100 (NaN skipped): P50 = 50, P99 = 99
    assert route_figures(np.append(np.arange(101.0), np.nan)) == _figures(50.0, 99.0)
    assert all(math.isnan(v) for v in route_figures(np.array([np.nan])).values())


def test_the_latest_window_holds_only_requests_completed_by_then():
    trace = make_trace([(t, 100, 2, blocks(range(1, 2), 10 + t, 100)) for t in range(10)])
    window = latest_window(trace, now_s=7.0, window_s=4.0, completed_ids={0, 3, 4, 6, 7, 8})
    assert [r.request_id for r in window.requests] == [3, 4, 6]  # arrivals 3–6 s; 5 still running, 7 not yet arrived
    assert window.requests[0] is trace.requests[3] and window.name == trace.name


def test_the_simulator_replays_the_latest_window_after_its_warm_up():
    trace = make_trace([(0.25 * i, 600, 4, blocks(range(1, 11), 100 * (i + 1), 600)) for i in range(80)])
    config = ClusterConfig(fleet=("a100", "a100"), warmup_s=2.0, router=RouterSettings(policy="learned_cost_aware"))
    online = OnlineSettings(min_rows=20, gate_on_replay=True, replay_window_s=5.0, replay_warmup_s=3.0)
    sim = ClusterSimulator(config, trace.block_size_tokens, online=online)
    with pytest.raises(RuntimeError, match="replay_window needs an online replay in progress"):
        sim.replay_window(TermModelSet.analytic(), 10.0)
    sim.run(trace)  # every request completes: the window is all arrivals in [5, 10) s, its warm-up [2, 5) s
    assert sim.online.window_replay == sim.replay_window
    figures = sim.replay_window(TermModelSet.analytic(), 10.0)
    warm = replace(trace, requests=trace.requests[8:40])
    alone = ClusterSimulator(replace(config, warmup_s=5.0), trace.block_size_tokens).run(warm)
    assert len(alone.requests) == 20 and figures == route_figures(alone.requests["actual_ttft_s"].to_numpy())
    sim.online.settings = replace(online, replay_warmup_s=0.0)  # no warm-up: the window from an empty cluster
    cold = ClusterSimulator(replace(config, warmup_s=0.0), trace.block_size_tokens).run(
        replace(trace, requests=trace.requests[20:40])
    )
    assert sim.replay_window(TermModelSet.analytic(), 10.0) == route_figures(cold.requests["actual_ttft_s"].to_numpy())
