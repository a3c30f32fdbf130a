"""``kvcost workload``: a generated workload written as Mooncake JSONL replays like any trace."""

import json

import pytest
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
    assert "error: NAME = 'gen:nope': unknown workload 'nope'; expected one of: agent" in result.output
    assert not (tmp_path / "x.jsonl").exists()


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["gen:mix:requests=-5", "{tmp}/x.jsonl"], "error: NAME = 'gen:mix:requests=-5': requests = -5, expected"),
        (["gen:mix", "{tmp}/nope/x.jsonl"], "error: OUT = '{tmp}/nope/x.jsonl': no folder '{tmp}/nope', expected"),
        (["gen:mix", "{tmp}/x.csv"], "error: OUT = '{tmp}/x.csv', expected a .jsonl path"),
    ],
)
def test_workload_names_its_argument_in_a_refusal(tmp_path, args, line):
    result = runner.invoke(app, ["workload", *(a.format(tmp=tmp_path) for a in args)])
    assert result.exit_code == 2 and line.format(tmp=tmp_path) in " ".join(result.output.split()), result.output
    assert list(tmp_path.iterdir()) == []
