"""ReuseRefit: cost_aware's P(reuse) refitted on the pools' block history on a schedule, in a replay and alone."""

import json

import pandas as pd
import pytest

from kvcost.eviction import EvictionContext, make_eviction_policy
from kvcost.models.reuse_cure import CureReuseModel
from kvcost.replay.eviction_study import StudySettings, check_settings, run_study
from kvcost.replay.reuse_refit import ReuseRefit

COLUMNS = ["worker_id", "t_s", "block_hash", "event", "depth_blocks", "request_blocks", "reused_blocks"]


def history() -> pd.DataFrame:
    """Block 1 reused 4 s after turning idle; block 2 idle since t = 1 s, never reused."""
    rows = [
        (0, 0.0, 1, "stored", 0, 2, 0),
        (0, 0.0, 2, "stored", 1, 2, 0),
        (0, 1.0, 1, "idle", 0, 2, 0),
        (0, 1.0, 2, "idle", 1, 2, 0),
        (0, 5.0, 1, "hit", 0, 1, 1),
        (0, 6.0, 1, "idle", 0, 1, 1),
    ]
    return pd.DataFrame(rows, columns=COLUMNS)


def policies():
    context = EvictionContext(horizon_s=30.0)
    return [make_eviction_policy("cost_aware", context), make_eviction_policy("gdsf", context)]


def test_a_refit_waits_for_its_time_and_reads_the_history_only_then():
    refit = ReuseRefit(every_s=10.0, horizon_s=30.0)
    calls = []
    assert not refit.maybe_refit(9.9, lambda: calls.append(1) or history(), policies())
    assert calls == [] and refit.next_s == 10.0


def test_a_due_refit_installs_the_cure_model_in_the_policies_that_use_one():
    refit = ReuseRefit(every_s=10.0, horizon_s=30.0)
    cost_aware, gdsf = policies()
    assert refit.maybe_refit(12.0, history, [cost_aware, gdsf])
    assert isinstance(cost_aware.context.reuse_model, CureReuseModel)
    assert cost_aware.context.reuse_model.horizon_s == 30.0
    assert gdsf.context.reuse_model is None
    assert refit.refits == [{"t_s": 12.0, "idle_periods": 3, "reuses": 1}] and refit.next_s == 22.0


def test_a_history_without_a_reuse_installs_nothing():
    refit = ReuseRefit(every_s=10.0, horizon_s=30.0)
    cost_aware, _ = policies()
    no_reuse = history().query("event != 'hit'")
    assert not refit.maybe_refit(10.0, lambda: no_reuse, [cost_aware])
    assert cost_aware.context.reuse_model is None and refit.next_s == 20.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"every_s": 0.0, "horizon_s": 1.0}, "every_s = 0.0, expected a finite number of seconds > 0"),
        ({"every_s": 1.0, "horizon_s": float("inf")}, "horizon_s = inf, expected a finite number of seconds > 0"),
    ],
)
def test_bad_refit_settings_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ReuseRefit(**kwargs)
    if "every_s" in kwargs and kwargs["every_s"] == 0.0:
        with pytest.raises(ValueError, match="refit_every_s = 0.0, expected a finite number of seconds > 0"):
            check_settings(StudySettings(refit_every_s=0.0))


def test_the_study_refits_cost_aware_during_the_measured_part(tmp_path):
    settings = StudySettings(
        duration_s=240, fractions=(0.1,), policies=("gdsf", "cost_aware"), refit_every_s=30, jobs=1
    )
    run_study(settings, tmp_path)
    rows = {r["policy"]: r for r in json.loads((tmp_path / "eviction.json").read_text())["results"]}
    assert rows["gdsf"]["reuse_refits"] == 0
    assert rows["cost_aware"]["reuse_refits"] == 9  # every 30 s from 30 s past the split to the last arrival
