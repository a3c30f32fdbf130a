"""Tests for kvcost.calibration.drift (DriftMonitor, DriftAlert).

Errors are multiples of 1/8 s so rolling sums are exact.
"""

import dataclasses

import numpy as np
import pytest

from kvcost.calibration.drift import MONITORED_TERMS, DriftAlert, DriftMonitor
from kvcost.core.composition import TERMS

QUEUE_REF_S = 0.125  # |1.125 − 1.0|
PREFILL_REF_S = 0.0625  # |0.5625 − 0.5|


def _observe(monitor, worker_id, t, queue_actual_s):
    monitor.observe(
        worker_id,
        float(t),
        predicted={"queue": 1.0, "prefill": 0.5},
        actual={"queue": queue_actual_s, "prefill": 0.5625},
    )


def _run(monitor, start, stop, drifting_worker=None, drift_from=None, drift_until=None):
    """One observation per worker per second, a check after each second; returns {t: alerts}."""
    fired = {}
    for t in range(start, stop):
        for worker in (1, 2):
            drifting = worker == drifting_worker and drift_from <= t < (drift_until or 10**9)
            _observe(monitor, worker, t, 2.125 if drifting else 1.125)
        alerts = monitor.check(float(t))
        if alerts:
            fired[t] = alerts
    return fired


def _monitor():
    monitor = DriftMonitor()  # window 200, min 50, band 2.0×, coverage (0.80, 0.97)
    monitor.set_reference({"queue": QUEUE_REF_S, "prefill": PREFILL_REF_S})
    return monitor


def test_monitored_terms_are_the_ttft_terms_plus_ttft():
    assert MONITORED_TERMS == (*TERMS, "ttft")


def test_stable_stream_raises_no_alert():
    rng = np.random.default_rng(0)
    monitor = DriftMonitor()
    monitor.set_reference({term: 0.02 for term in MONITORED_TERMS})
    for i in range(2000):
        for worker in range(3):
            predicted = {term: 0.2 for term in MONITORED_TERMS}
            actual = {term: 0.2 + rng.normal(0.0, 0.025) for term in MONITORED_TERMS}  # MAE ≈ 0.02
            actual = {term: max(value, 0.0) for term, value in actual.items()}
            upper_s = 0.0 if i % 10 == 9 else 10.0  # every 10th misses: 90 % covered, in band
            monitor.observe(worker, 0.5 * i, predicted, actual, ttft_upper90_s=upper_s)
        assert monitor.check(0.5 * i) == []
    assert monitor.alerts_total == {}
    assert not monitor.should_retrain


def test_queue_drift_raises_exactly_one_alert_with_the_exact_message():
    monitor = _monitor()
    fired = _run(monitor, 0, 400, drifting_worker=2, drift_from=100)
    # Window after k drifted observations: 100 × 0.125 + k × 1.125 over 100 + k values;
    # above 2 × 0.125 from k = 15 (t = 114): 29.375 / 115 / 0.125 = 2.043…
    assert list(fired) == [114]
    (alert,) = fired[114]
    assert alert == DriftAlert(
        worker_id=2,
        term="queue",
        metric="mae_ratio",
        value=pytest.approx(29.375 / 115 / 0.125),
        band=(0.0, 2.0),
        window_start_s=0.0,
        window_end_s=114.0,
        message="worker 2 queue: rolling MAE 2.04× reference (band ≤ 2.0×) over 0.0–114.0 s",
    )
    assert 114 - 100 + 1 <= monitor.window
    assert monitor.alerts_total == {(2, "queue"): 1}
    with pytest.raises(dataclasses.FrozenInstanceError):
        alert.value = 0.0


def test_returning_to_normal_rearms_the_alert():
    monitor = _monitor()
    assert list(_run(monitor, 0, 400, drifting_worker=2, drift_from=100)) == [114]
    # Back to normal at t = 400: after j normal observations the full window holds
    # (200 − j) × 1.125 + j × 0.125; it is back inside (≤ 2×, exactly 2.0) at j = 175 (t = 574).
    assert _run(monitor, 400, 575) == {}
    assert monitor.alerts_total == {(2, "queue"): 1}
    # From t = 600 it drifts again: (25 + k) / 200 / 0.125 > 2 from k = 26 (t = 625).
    fired = _run(monitor, 575, 700, drifting_worker=2, drift_from=600)
    assert list(fired) == [625]
    (alert,) = fired[625]
    assert alert.message == "worker 2 queue: rolling MAE 2.04× reference (band ≤ 2.0×) over 426.0–625.0 s"
    assert (alert.window_start_s, alert.window_end_s) == (426.0, 625.0)
    assert monitor.alerts_total == {(2, "queue"): 2}


def test_no_rearm_while_still_outside():
    monitor = _monitor()
    # stays drifted for far longer than a window: one alert only
    fired = _run(monitor, 0, 1000, drifting_worker=2, drift_from=100)
    assert list(fired) == [114]


def _observe_ttft(monitor, t, covered):
    monitor.observe(0, float(t), predicted={}, actual={"ttft": 1.0}, ttft_upper90_s=1.5 if covered else 0.5)


def test_coverage_alert_when_actual_exceeds_the_bound_too_often():
    monitor = DriftMonitor()
    fired = {}
    for t in range(200):
        # every 10th request misses its bound (90 %) until t = 100, then every one misses
        _observe_ttft(monitor, t, covered=t < 100 and t % 10 != 9)
        if alerts := monitor.check(float(t)):
            fired[t] = alerts
    # 90 covered out of 100 + k: below 80 % from k = 13 (t = 112): 90 / 113 = 79.6 %
    assert list(fired) == [112]
    (alert,) = fired[112]
    assert alert.metric == "coverage_90" and alert.term == "ttft" and alert.worker_id == 0
    assert alert.value == pytest.approx(90 / 113)
    assert alert.band == (0.80, 0.97)
    assert alert.message == "worker 0 ttft: P90 coverage 79.6 % (band 80.0–97.0 %) over 0.0–112.0 s"
    assert monitor.alerts_total == {(0, "ttft"): 1}


def test_coverage_alert_when_bounds_are_too_wide():
    monitor = DriftMonitor()
    for t in range(49):
        _observe_ttft(monitor, t, covered=True)
        assert monitor.check(float(t)) == []  # fewer than min_observations
    _observe_ttft(monitor, 49, covered=True)
    (alert,) = monitor.check(49.0)
    assert alert.message == "worker 0 ttft: P90 coverage 100.0 % (band 80.0–97.0 %) over 0.0–49.0 s"


def test_should_retrain_and_reset():
    monitor = _monitor()
    assert not monitor.should_retrain
    _run(monitor, 0, 200, drifting_worker=2, drift_from=100)
    assert monitor.should_retrain
    monitor.reset_retrain_flag()
    assert not monitor.should_retrain
    _run(monitor, 200, 400, drifting_worker=2, drift_from=100)  # still out of band: no new alert
    assert not monitor.should_retrain
    _run(monitor, 400, 700, drifting_worker=2, drift_from=600)  # back in band, then a new alert
    assert monitor.should_retrain


def test_reference_from_the_first_full_window_when_never_set():
    monitor = DriftMonitor(window=10, min_observations=5)
    for t in range(9):
        _observe(monitor, 1, t, 1.125)
        assert monitor.reference_mae_s(1, "queue") is None
        assert monitor.check(float(t)) == []
    _observe(monitor, 1, 9, 1.125)
    assert monitor.reference_mae_s(1, "queue") == 0.125
    assert monitor.reference_mae_s(1, "prefill") == 0.0625
    # (9 × 0.125 + 1.125) / 10 = 0.225: inside; two drifted: 0.325 / 0.125 = 2.6: outside
    _observe(monitor, 1, 10, 2.125)
    assert monitor.check(10.0) == []
    _observe(monitor, 1, 11, 2.125)
    (alert,) = monitor.check(11.0)
    assert alert.message == "worker 1 queue: rolling MAE 2.60× reference (band ≤ 2.0×) over 2.0–11.0 s"
    # the estimate is frozen; an explicit reference overrides it for every worker
    assert monitor.reference_mae_s(1, "queue") == 0.125
    monitor.set_reference({"queue": 1.0})
    assert monitor.reference_mae_s(1, "queue") == 1.0
    assert monitor.reference_mae_s(1, "prefill") == 0.0625


def test_exactly_predicted_term_does_not_alert_on_noise():
    monitor = DriftMonitor()
    monitor.set_reference({"transfer": 0.0})
    for t in range(300):
        monitor.observe(1, float(t), {"transfer": 0.0}, {"transfer": 1e-5 * (t % 3)})
        assert monitor.check(float(t)) == []


def test_alerts_are_ordered_by_worker_then_term():
    monitor = DriftMonitor(window=10, min_observations=10)
    monitor.set_reference({"queue": 0.125, "prefill": 0.125})
    for t in range(10):
        for worker in ("b", "a"):
            monitor.observe(worker, float(t), {"queue": 0.0, "prefill": 0.0}, {"prefill": 1.0, "queue": 1.0})
    assert [(a.worker_id, a.term) for a in monitor.check(9.0)] == [
        ("b", "queue"),
        ("b", "prefill"),
        ("a", "queue"),
        ("a", "prefill"),
    ]


def test_observe_and_check_errors():
    monitor = DriftMonitor()
    with pytest.raises(ValueError, match="unknown term 'queueing' in predicted"):
        monitor.observe(1, 0.0, {"queueing": 1.0}, {"queue": 1.0})
    with pytest.raises(ValueError, match=r"actual\['queue'\] must be finite and ≥ 0 seconds; got nan"):
        monitor.observe(1, 0.0, {"queue": 1.0}, {"queue": float("nan")})
    with pytest.raises(ValueError, match="ttft_upper90_s given but actual has no 'ttft'"):
        monitor.observe(1, 0.0, {"queue": 1.0}, {"queue": 1.0}, ttft_upper90_s=2.0)
    with pytest.raises(ValueError, match="unknown term 'x' in mae_by_term"):
        monitor.set_reference({"x": 1.0})
    with pytest.raises(ValueError, match="min_observations must be in"):
        DriftMonitor(window=10, min_observations=11)
    monitor.check(5.0)
    with pytest.raises(ValueError, match="now_s went backwards"):
        monitor.check(4.0)


def test_peer_reference_flags_the_straggler_not_a_shared_surge():
    monitor = DriftMonitor(window=20, min_observations=10, reference="peers")
    for i in range(20):  # a load surge: every worker's queue error is 1 s
        for worker in range(4):
            monitor.observe(worker, float(i), {"queue": 0.0}, {"queue": 1.0})
    assert monitor.check(20.0) == []
    assert monitor.reference_mae_s(0, "queue") == 1.0
    for i in range(20, 40):  # worker 2 alone drifts to 3 s
        for worker in range(4):
            monitor.observe(worker, float(i), {"queue": 0.0}, {"queue": 3.0 if worker == 2 else 1.0})
    alerts = monitor.check(40.0)
    assert [(a.worker_id, a.term, a.value) for a in alerts] == [(2, "queue", 3.0)]


def test_peer_reference_needs_two_peers():
    monitor = DriftMonitor(window=5, min_observations=5, reference="peers")
    for i in range(5):
        monitor.observe(0, float(i), {"queue": 0.0}, {"queue": 1.0})
        monitor.observe(1, float(i), {"queue": 0.0}, {"queue": 9.0})
    assert monitor.reference_mae_s(0, "queue") is None and monitor.check(5.0) == []
    with pytest.raises(ValueError, match="reference must be 'model' or 'peers'"):
        DriftMonitor(reference="other")
