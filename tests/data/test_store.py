from datetime import datetime

import duckdb
import pandas as pd
import pytest

from kvcost.data.store import SCHEMA, LogStore, schema_markdown
from kvcost.features.spec import feature_spec_hash


def _samples(n: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "t_s": [float(i) for i in range(n)],
            "worker_id": [i % 2 for i in range(n)],
            "waiting_requests": [1] * n,
            "running_requests": [2] * n,
            "queued_prefill_tokens": [100 * i for i in range(n)],
            "kv_usage": [0.5] * n,
            "idle_cached_blocks": [7] * n,
        }
    )


def test_open_creates_every_table(tmp_path):
    with LogStore(tmp_path / "sub" / "log.duckdb").open() as store:
        tables = {r[0] for r in store.connection.execute("SHOW TABLES").fetchall()}
    assert tables == set(SCHEMA)


def test_write_frame_appends_in_schema_order_and_survives_reopen(tmp_path):
    path = tmp_path / "log.duckdb"
    frame = _samples(3)[list(reversed(_samples(3).columns))]  # column order does not matter
    with LogStore(path).open() as store:
        assert store.write_frame("worker_samples", "r1", frame) == 3
        store.write_run("r1", "balanced_cache", "mooncake-conversation", {"seed": 0}, datetime(2026, 1, 2))
    with LogStore(path).open() as store:
        store.write_frame("worker_samples", "r2", _samples(2))
        rows = store.connection.execute(
            "SELECT run_id, t_s, queued_prefill_tokens FROM worker_samples ORDER BY run_id, t_s"
        ).fetchall()
        run = store.connection.execute("SELECT configuration, params_json, feature_spec_hash FROM runs").fetchall()
    assert rows == [("r1", 0.0, 0), ("r1", 1.0, 100), ("r1", 2.0, 200), ("r2", 0.0, 0), ("r2", 1.0, 100)]
    assert run == [("balanced_cache", '{"seed": 0}', feature_spec_hash())]


def test_write_frame_rejects_missing_and_extra_columns_and_keeps_rows(tmp_path):
    with LogStore(tmp_path / "log.duckdb").open() as store:
        store.write_frame("worker_samples", "r1", _samples(1))
        bad = _samples(1).drop(columns=["kv_usage"]).assign(colour="red")
        with pytest.raises(ValueError, match=r"missing columns \['kv_usage'\], unexpected columns \['colour'\]"):
            store.write_frame("worker_samples", "r2", bad)
        with pytest.raises(KeyError, match="unknown table 'nope'"):
            store.write_frame("nope", "r2", bad)
        assert store.connection.execute("SELECT count(*) FROM worker_samples").fetchone() == (1,)


def test_older_log_gains_new_columns_and_keeps_rows(tmp_path):
    path = tmp_path / "log.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE runs (run_id VARCHAR)")
    con.execute("INSERT INTO runs VALUES ('old')")
    con.close()
    with LogStore(path).open() as store:
        rows = store.connection.execute("SELECT run_id, configuration, feature_spec_hash FROM runs").fetchall()
    assert rows == [("old", None, None)]


def test_candidates_table_carries_the_feature_spec():
    from kvcost.features.spec import FEATURE_NAMES

    names = [c.name for c in SCHEMA["candidates"]]
    assert names[4 : 4 + len(FEATURE_NAMES)] == list(FEATURE_NAMES)
    assert "`candidates`" in schema_markdown()


def test_closed_store_refuses_reads(tmp_path):
    with pytest.raises(RuntimeError, match="not open"):
        _ = LogStore(tmp_path / "x.duckdb").connection


def test_a_file_that_is_not_a_duckdb_database_is_refused_and_left_unchanged(tmp_path):
    trace = tmp_path / "mix.jsonl"
    trace.write_text('{"timestamp": 0}\n')
    with pytest.raises(duckdb.IOException, match=r"mix.jsonl is not a DuckDB database file \(no b'DUCK' header\)"):
        LogStore(trace).open()
    assert trace.read_text() == '{"timestamp": 0}\n'
    (tmp_path / "empty.duckdb").touch()
    with pytest.raises(duckdb.IOException, match="empty.duckdb is not a DuckDB database file"):
        LogStore(tmp_path / "empty.duckdb").open()
    with LogStore(tmp_path / "new.duckdb").open() as store:  # a path that does not exist becomes a database
        assert "requests" in {r[0] for r in store.connection.execute("SHOW TABLES").fetchall()}
    LogStore(tmp_path / "new.duckdb").open().close()  # and a DuckDB file opens again
