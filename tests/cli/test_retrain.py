"""Tests for ``kvcost retrain``'s exit status (kvcost issue 15: it exited 0 with the log unreadable)."""

import re

import pytest
from typer.testing import CliRunner

from kvcost.cli import app


def test_an_unreadable_log_exits_3(tmp_path):
    args = ["retrain", "--every-s", "1", "--iterations", "1", "--db", str(tmp_path / "missing.duckdb")]
    args += ["--mlflow-uri", f"sqlite:///{tmp_path}/mlflow.db"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 3, result.output
    assert "round 1: log not readable" in result.output
    assert "1 round(s), 0 promotion(s), 1 with the log not readable" in result.output


def _one_refused_round(tmp_path, monkeypatch, refused):
    """Output of one ``kvcost retrain`` round whose promotion returns ``refused`` (exit status 1 asserted)."""
    from types import SimpleNamespace

    from kvcost.models import mlflow_store, train_job

    monkeypatch.setattr(train_job, "run_training", lambda db, **kw: SimpleNamespace(version=refused.version))
    monkeypatch.setattr(mlflow_store, "promote", lambda uri, version: refused)
    result = CliRunner().invoke(app, ["retrain", "--every-s", "1", "--iterations", "1", "--db", str(tmp_path)])
    assert result.exit_code == 1, result.output
    return result.output.replace("\n", " ")


def test_a_refused_challenger_exits_1_and_prints_both_maes(tmp_path, monkeypatch):
    from kvcost.models.mlflow_store import Promotion

    refused = Promotion(False, "2", {"ttft_mae_s": 0.5}, {"ttft_mae_s": 0.25}, "version 2 refused: worse than champion")
    assert (
        "round 1: version 2 refused: worse than champion (TTFT MAE on the challenger's holdout: "
        "challenger 0.5000 s, champion 0.2500 s)" in _one_refused_round(tmp_path, monkeypatch, refused)
    )


def test_without_a_champion_a_round_reports_the_analytic_models_error(tmp_path, monkeypatch):
    from kvcost.models.mlflow_store import Promotion

    challenger = {"ttft_mae_s": 0.5, "analytic_ttft_mae_s": 0.25}
    refused = Promotion(False, "1", challenger, None, "version 1 refused: worse than the analytic model")
    assert (
        "round 1: version 1 refused: worse than the analytic model (TTFT MAE on the challenger's holdout: "
        "challenger 0.5000 s, analytic 0.2500 s)" in _one_refused_round(tmp_path, monkeypatch, refused)
    )


@pytest.mark.parametrize(
    "command", [["retrain", "--every-s", "1", "--iterations", "1"], ["experiment", "--learned"], ["models", "list"]]
)
def test_a_sqlite_store_in_a_missing_folder_is_a_usage_error(tmp_path, command):
    uri = f"sqlite:///{tmp_path}/nowhere/mlflow.db"
    result = CliRunner().invoke(app, [*command, "--mlflow-uri", uri])
    assert result.exit_code == 2
    line = f"error: --mlflow-uri = {uri}, the folder '{tmp_path}/nowhere' does not exist, expected the folder"
    assert line in re.sub(r"\s+", " ", result.output)
    assert not (tmp_path / "nowhere").exists()
