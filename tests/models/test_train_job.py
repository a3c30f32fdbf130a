"""The scheduled retraining job: rounds, the injected sleep, and a locked or missing log."""

import duckdb
import pytest

from kvcost.models.train_job import retrain_loop


def test_missing_log_is_reported_and_retried(tmp_path):
    slept, lines = [], []
    history = retrain_loop(
        tmp_path / "missing.duckdb",
        every_s=5,
        iterations=2,
        sleep=slept.append,
        report=lines.append,
        mlflow_uri=f"sqlite:///{tmp_path / 'm.db'}",
        out_root=tmp_path,
    )
    assert slept == [5]
    assert [h["round"] for h in history] == [1, 2] and not any(h["promoted"] for h in history)
    assert lines[0].startswith("round 1: log not readable, retrying next round: db = ")


def test_log_locked_by_a_writer_is_retried(tmp_path):
    path = tmp_path / "log.duckdb"
    writer = duckdb.connect(str(path))  # another connection in this process holds the file open for writing
    writer.execute("CREATE TABLE t (x INT)")
    lines = []
    history = retrain_loop(
        path,
        every_s=1,
        iterations=1,
        sleep=lambda s: None,
        report=lines.append,
        mlflow_uri=f"sqlite:///{tmp_path / 'm.db'}",
        out_root=tmp_path,
    )
    writer.close()
    assert history[0]["version"] is None and "log not readable" in lines[0]


def test_every_s_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="every_s = 0, expected a number > 0"):
        retrain_loop(tmp_path / "x", every_s=0)
