"""``kvcost experiment``: outputs, determinism, and bad input exiting 2 with one line."""

import json
import sys

import duckdb
import pytest
from typer.testing import CliRunner

from kvcost.cli import app

runner = CliRunner()


def _experiment(tmp_path, name, *extra):
    out = tmp_path / name
    args = ["experiment", "--duration-s", "45", "--out", str(out), "--db", str(tmp_path / "log.duckdb"), *extra]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return out, result.output


@pytest.mark.slow
def test_experiment_writes_outputs_and_is_deterministic(tmp_path):
    out1, output = _experiment(tmp_path, "a")
    out2, _ = _experiment(tmp_path, "b")
    assert (out1 / "summary.json").read_bytes() == (out2 / "summary.json").read_bytes()
    summary = json.loads((out1 / "summary.json").read_text())
    assert set(summary["configs"]) == {
        "balanced_nocache",
        "balanced_cache",
        "cost_aware",
        "cost_aware_tiered",
        "cost_aware_evicting",
    }
    assert summary["requests"] == summary["configs"]["cost_aware"]["completed"] > 0
    assert summary["configs"]["balanced_nocache"]["hit_ratio"] == 0.0
    assert len(summary["diagnosis"]) == 5
    assert summary["diagnosis"][4].startswith(
        "kvcost's eviction in the workers: cost_aware_evicting (evicting by cost_aware) vs cost_aware (by lru): "
    )
    for name in ("report.md", "ttft_cdf.png", "queued_prefill_tokens.png"):
        assert (out1 / name).stat().st_size > 0
    assert "cache gain (balanced_nocache → balanced_cache): P50" in output and "report:" in output
    assert "eviction gain (cost_aware → cost_aware_evicting): P50" in (out1 / "report.md").read_text()
    con = duckdb.connect(str(tmp_path / "log.duckdb"))
    assert con.execute("SELECT count(*) FROM runs").fetchone() == (10,)  # appended, never overwritten
    n_requests = con.execute("SELECT count(*) FROM requests").fetchone()[0]
    assert n_requests == 10 * summary["requests"]
    assert con.execute("SELECT count(*) FROM candidates").fetchone()[0] == 4 * n_requests


def test_seed_changes_the_result(tmp_path):
    out1, _ = _experiment(tmp_path, "a", "--duration-s", "20")
    out2, _ = _experiment(tmp_path, "b", "--duration-s", "20", "--seed", "1")
    assert (out1 / "summary.json").read_bytes() != (out2 / "summary.json").read_bytes()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["experiment", "--rate-scale", "0"], "error: --rate-scale = 0.0, expected a finite number > 0"),
        (["experiment", "--duration-s", "0"], "error: --duration-s = 0.0"),
        (["experiment", "--fleet", "a100:2,tpu:1"], "fleet GPU 'tpu'"),
        (["experiment", "--slowdown", "x"], "slowdown 'x'"),
        (["experiment", "--trace", "nope.parquet"], "nope.parquet"),
        (["replay", "--policy", "magic"], "--policy = 'magic'"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, args, message):
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "o"), "--db", str(tmp_path / "d.duckdb")])
    assert result.exit_code == 2
    assert message in result.output
    assert result.output.strip().startswith("error:")
    assert not (tmp_path / "d.duckdb").exists()


@pytest.mark.parametrize(("flag", "gated"), [([], True), (["--no-replay-gate"], False), (["--replay-gate"], True)])
def test_the_replay_gate_flag_reaches_the_online_learner(tmp_path, monkeypatch, flag, gated):
    seen = []
    module = sys.modules["kvcost.cli.experiment"]  # the package's ``experiment`` attribute is the command
    monkeypatch.setattr(module, "run_arms", lambda spec, arms, setup: seen.append(setup))
    args = ["experiment", "--online", "--retrain-every-s", "60", *flag, "--out", str(tmp_path / "o")]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert seen[0].online.gate_on_replay is gated and seen[0].online.retrain_every_s == 60
