"""``kvcost workload``: a generated workload written as Mooncake JSONL replays like any trace."""

import json

from typer.testing import CliRunner

from kvcost.cli import app

runner = CliRunner()


def test_workload_writes_a_mooncake_trace_that_replays(tmp_path):
    path = tmp_path / "agent.jsonl"
    result = runner.invoke(app, ["workload", "gen:agent:requests=40", str(path), "--seed", "1"])
    assert result.exit_code == 0 and "40 requests" in result.output
    assert len(path.read_text().splitlines()) == 40
    out = tmp_path / "run"
    args = ["replay", "--trace", str(path), "--policy", "least_loaded", "--out", str(out), "--db", str(tmp_path / "l")]
    assert runner.invoke(app, args).exit_code == 0
    assert json.loads((out / "physical_limit.json").read_text())["requests"] == 40


def test_workload_refuses_an_unknown_shape_with_one_line(tmp_path):
    result = runner.invoke(app, ["workload", "gen:nope", str(tmp_path / "x.jsonl")])
    assert result.exit_code == 2
    assert "nope" in result.output and not (tmp_path / "x.jsonl").exists()
