"""``kvcost eviction-study``: a quick CLI run on a tiny window, setting checks; the full 4 × 7 study as a benchmark."""

import json
import time

import pytest
from typer.testing import CliRunner

from kvcost.cli import app
from kvcost.data.store import LogStore
from kvcost.models.reuse_cure import CureReuseModel
from kvcost.replay.eviction_study import (
    StudySettings,
    check_settings,
    headroom,
    headroom_lines,
    run_study,
    study_horizon_s,
    study_reuse_model,
)

runner = CliRunner()


def test_headroom_to_the_clairvoyant_reference_per_cache_size():
    saved = {
        0.05: {"lru": 80.0, "gdsf": 100.0, "cost_aware": 125.0, "clairvoyant": 150.0},
        0.1: {"lru": 9.0},
        0.25: {"lru": 200.0, "cost_aware": 190.0, "clairvoyant": 201.0},
    }
    rows = [{"policy": p, "cache_fraction": f, "prefill_saved_s": v} for f, at in saved.items() for p, v in at.items()]
    assert headroom(rows) == [
        {
            "cache_fraction": 0.05,
            "best_other": "gdsf",
            "best_other_s": 100.0,
            "clairvoyant_gain": 0.5,
            "cost_aware_gain": 0.25,
            "captured": 0.5,
        },
        {
            "cache_fraction": 0.25,
            "best_other": "lru",
            "best_other_s": 200.0,
            "clairvoyant_gain": 201.0 / 200.0 - 1,
            "cost_aware_gain": 190.0 / 200.0 - 1,
            "captured": pytest.approx(float("nan"), nan_ok=True),  # a 0.5 % headroom: no share of it
        },
    ]  # 0.1 has no clairvoyant row


def test_quick_study_through_the_cli(tmp_path):
    out = tmp_path / "study"
    args = ["eviction-study", "--duration-s", "60", "--fractions", "0.1,0.5", "--policies", "lru,gdsf,cost_aware"]
    result = runner.invoke(app, [*args, "--jobs", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "eviction.json").read_text())
    assert [(r["policy"], r["cache_fraction"]) for r in data["results"]] == [
        ("lru", 0.1),
        ("gdsf", 0.1),
        ("cost_aware", 0.1),
        ("lru", 0.5),
        ("gdsf", 0.5),
        ("cost_aware", 0.5),
    ]
    for row in data["results"]:
        assert {"policy", "cache_fraction", "hit_ratio", "prefill_saved_s", "ttft_p99_s"} <= set(row)
        assert 0 <= row["hit_ratio"] <= 1
    assert (out / "eviction.md").read_text().startswith("# kvcost eviction study")
    assert (out / "eviction.png").stat().st_size > 0
    assert "report:" in result.output


def test_bad_settings_exit_2_with_the_reason(tmp_path):
    result = runner.invoke(app, ["eviction-study", "--fractions", "0,0.1", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "fractions contains 0.0, expected numbers in (0, 1]" in result.output
    result = runner.invoke(app, ["eviction-study", "--policies", "lru,foo", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "--policies contains 'foo', expected registered eviction policies" in result.output
    assert "eviction study runs" not in result.output  # refused before any run starts
    result = runner.invoke(app, ["eviction-study", "--trace", "gen:nope", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "--trace = 'gen:nope': unknown workload 'nope'; expected one of: agent, mix" in result.output
    assert "eviction study runs" not in result.output
    with pytest.raises(
        ValueError, match="policies contains 'mru', expected registered eviction policies: clairvoyant, cost_aware"
    ):
        check_settings(StudySettings(policies=("mru",)))
    with pytest.raises(ValueError, match="reuse_model = 'xgb'"):
        check_settings(StudySettings(reuse_model="xgb"))
    for args, line in (
        (["--duration-s", "-1"], "--duration-s = -1.0, expected a finite number of seconds > 0 (or none: all)"),
        (["--rate-scale", "0"], "--rate-scale = 0.0, expected a finite number > 0"),
        (["--refit-every-s", "-1"], "--refit-every-s = -1, expected greater than or equal to 0"),
    ):
        result = runner.invoke(app, ["eviction-study", *args, "--out", str(tmp_path)])
        assert result.exit_code == 2 and line in result.output, result.output
        assert "eviction study runs" not in result.output  # refused before any run starts


def test_the_study_fits_the_cure_model_by_default_and_cost_aware_loads_what_was_saved(tmp_path):
    assert StudySettings().reuse_model == "cure"
    (tmp_path / "prior").mkdir()
    (tmp_path / "prior" / "horizon_s.txt").write_text("12.5\n")
    assert study_reuse_model(tmp_path / "prior") == (None, 12.5)
    CureReuseModel(30.0, [(0.2, 5.0, 1.0)] * 4).save(tmp_path / "cure")
    model, horizon_s = study_reuse_model(tmp_path / "cure")
    assert isinstance(model, CureReuseModel) and horizon_s == 30.0
    out = tmp_path / "study"
    run_study(StudySettings(duration_s=120, fractions=(0.1,), policies=("cost_aware",), jobs=1), out)
    training = json.loads((out / "eviction.json").read_text())["training"][0]
    assert training["classifier_fitted"] and len(training["cure_params"]) == 4
    folder = out / "reuse_models" / "fraction_0.1"
    assert (folder / "cure.json").exists()
    with LogStore(folder / "block_events.duckdb").open() as store:  # the model was fitted on the DuckDB log
        assert len(store.read_block_events("train")) == training["block_events"] > 0


@pytest.mark.parametrize(
    ("given_s", "measured_s", "expected_s"),
    [(50.0, 20.0, 50.0), (None, 20.0, 20.0), (None, 0.0, 900.0), (None, float("nan"), 900.0)],
)
def test_the_horizon_is_the_given_one_else_a_positive_characteristic_time_else_the_training_part(
    given_s, measured_s, expected_s
):
    assert study_horizon_s(given_s, measured_s, training_s=900.0) == expected_s


@pytest.mark.bench
def test_bench_full_eviction_study(tmp_path):
    """The issue's study: 4 cache sizes × 7 policies on the whole conversation trace (prints figures)."""
    started = time.perf_counter()
    result = run_study(StudySettings(jobs=2), tmp_path)
    wall_s = time.perf_counter() - started
    print(f"\neviction study 4 × 7 on the whole trace: {wall_s:.0f} s wall")
    for r in result["results"]:
        print(
            f"{r['cache_fraction']:>5g} {r['policy']:>11} hit {r['hit_ratio']:.3f} "
            f"saved {r['prefill_saved_s']:8.1f} s  TTFT P99 {r['ttft_p99_s']:.2f} s  ({r['runtime_s']:.0f} s)"
        )
    for g in result["cost_aware_vs_lru"]:
        print(f"cost_aware vs lru at {g['cache_fraction']:g}: prefill saved {g['prefill_saved_gain']:+.1%}")
    print(headroom_lines(result["headroom"]))
