"""``kvcost eviction-summary``: the table and the figures per group of cache sizes over saved studies."""

import json

from typer.testing import CliRunner

from kvcost.cli import app

runner = CliRunner()


def _write(folder, trace, seed, saved):
    folder.mkdir()
    results = [
        {"cache_fraction": f, "policy": p, "prefill_saved_s": s} for f, by in saved.items() for p, s in by.items()
    ]
    (folder / "eviction.json").write_text(json.dumps({"trace": trace, "seed": seed, "results": results}))
    return str(folder)


def test_eviction_summary_prints_each_cell_and_the_group_figures(tmp_path):
    a = _write(
        tmp_path / "a", "conv", 0, {0.05: {"gdsf": 120.0, "cost_aware": 126.0}, 0.5: {"lru": 50.0, "cost_aware": 50.0}}
    )
    b = _write(tmp_path / "b", "gen:mix", 2, {0.1: {"lru": 200.0, "cost_aware": 190.0}})
    result = runner.invoke(app, ["eviction-summary", a, b], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    assert "gdsf 120.0" in result.output and "+5.0%" in result.output and "-5.0%" in result.output
    assert "cache 0.05/0.1: 2 cells, mean cost_aware ÷ best − 1 +0.00%, 1 at or above the best, 1 within 1%" in (
        result.output
    )
    assert "cache 0.25/0.5: 1 cells, mean cost_aware ÷ best − 1 +0.00%, 1 at or above the best, 1 within 1%" in (
        result.output
    )


def test_eviction_summary_refuses_a_folder_without_a_study(tmp_path):
    result = runner.invoke(app, ["eviction-summary", str(tmp_path)])
    assert result.exit_code == 2
    assert f"error: {tmp_path}/eviction.json: no such file, expected the eviction.json of a" in result.output


def test_eviction_summary_prints_a_dash_for_a_gain_that_does_not_exist(tmp_path):
    a = _write(tmp_path / "a", "conv", 0, {0.05: {"lru": 0.0, "cost_aware": 3.0}})
    result = runner.invoke(app, ["eviction-summary", a], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    assert "lru 0.0" in result.output and "nan" not in result.output
    assert "cache 0.05/0.1: 0 cells, mean cost_aware ÷ best − 1 –, 0 at or above the best" in result.output
