"""Tests for kvcost.replay.promotion (the replay gate of ``kvcost models promote --trace``)."""

import pytest

from kvcost.replay.promotion import ReplayWindow, replay_gate


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("window_s", 0.0, "window_s = 0.0, expected seconds > 0"),
        ("workers", 0, "workers = 0, expected an integer ≥ 1"),
        ("rate_scale", -1.0, "rate_scale = -1.0, expected a number > 0"),
    ],
)
def test_bad_window_parameters_are_named(field, value, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        ReplayWindow("gen:agent:requests=100", **{field: value})


def test_the_window_is_the_latest_stretch_of_the_trace():
    full = ReplayWindow("gen:agent:requests=300", window_s=1e6).load()
    latest, start_s = ReplayWindow("gen:agent:requests=300", window_s=10.0).load()
    end_s = max(r.arrival_s for r in full[0].requests)
    assert (full[1], start_s) == (0.0, end_s - 10.0)
    assert 0 < len(latest) < len(full[0])
    assert min(r.arrival_s for r in latest.requests) >= 0.0


def test_the_same_model_on_both_sides_passes_with_equal_figures():
    gate = replay_gate(ReplayWindow("gen:agent:requests=300", window_s=1e6, workers=2, rate_scale=1.0))
    verdict = gate(None, None)
    assert verdict.passed and verdict.figures["challenger"] == verdict.figures["champion"]
    assert verdict.note.startswith("replay of gen:agent:requests=300 from 0 s (300 requests, 2 workers, rate scale 1)")
    assert verdict.note.endswith("with the analytic model (no loadable champion)")
