"""Tests of kvcost.data.log_writer: group commit, a failed batch rolled back alone, merged columns."""

import concurrent.futures

import numpy as np
import pyarrow as pa
import pytest

from kvcost.data.log_writer import LogWriter, _Write
from kvcost.data.store import LogStore, TableBatch


def _columns(run_id, request_id):
    return (
        {"run_id": [run_id], "t_s": [float(request_id)], "worker_id": [request_id % 3]}
        | {
            name: [1]
            for name in ("waiting_requests", "running_requests", "queued_prefill_tokens", "idle_cached_blocks")
        }
        | {"kv_usage": [0.5]}
    )


def _row(run_id, request_id):
    return TableBatch("worker_samples", _columns(run_id, request_id))


def test_log_writer_commits_concurrent_writes_in_groups_and_survives_a_failed_batch(tmp_path):
    store = LogStore(tmp_path / "log.duckdb").open()
    write_errors = []
    rolled = []
    writer = LogWriter(store, lambda: write_errors.append(1), roll=lambda: rolled.append(True), roll_interval_s=3600)
    writer.start()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = list(pool.map(lambda i: writer.submit(_row("r", i)), range(400)))
    assert [f.result(timeout=10) for f in futures] == [1] * 400
    assert writer.batches < 400  # group commit: writes that queue together share a transaction
    bad = writer.submit(TableBatch("worker_samples", _columns("r", 0) | {"t_s": ["late"]}))
    with pytest.raises(pa.ArrowInvalid, match="Could not convert 'late'"):
        bad.result(timeout=10)
    assert writer.last_error.startswith("ArrowInvalid: Could not convert 'late'")
    assert writer.submit(_row("r", 1000)).result(timeout=10) == 1
    assert writer.last_error is None
    writer.stop()
    assert rolled == [True]  # a last roll on stop
    assert store.connection.execute("SELECT count(*), sum(t_s) FROM worker_samples").fetchall() == [
        (401, sum(range(400)) + 1000.0)
    ]
    assert write_errors == [1]
    store.close()


def test_log_writer_merges_array_and_list_columns_into_one_batch(tmp_path):
    store = LogStore(tmp_path / "log.duckdb").open()
    writer = LogWriter(store)
    writes = [
        _Write(_row("a", 1)),
        _Write(TableBatch("worker_samples", {k: np.asarray(v) for k, v in _columns("b", 2).items()})),
    ]
    writer._commit(writes)  # what the thread does with one batch
    assert [w.future.result(timeout=0) for w in writes] == [1, 1] and writer.batches == 1
    got = store.connection.execute("SELECT run_id, t_s, worker_id FROM worker_samples ORDER BY t_s").fetchall()
    assert got == [("a", 1.0, 1), ("b", 2.0, 2)]
    store.close()


def test_log_writer_lingers_asleep_until_an_urgent_write_or_stop(tmp_path):
    """With an hour's linger, only an urgent write (then stop) can end the wait: if either did not, a
    ``result`` below would time out."""
    store = LogStore(tmp_path / "log.duckdb").open()
    writer = LogWriter(store, linger_s=3600.0)
    writer.start()
    lazy = [writer.submit(_row("r", i)) for i in range(3)]
    urgent = writer.submit(_row("r", 3), urgent=True)
    assert [f.result(timeout=10) for f in (*lazy, urgent)] == [1, 1, 1, 1]
    assert writer.batches == 1  # the urgent write took the lingering ones with it
    last = writer.submit(_row("r", 4))
    writer.stop()
    assert last.result(timeout=0) == 1 and writer.batches == 2
    assert store.connection.execute("SELECT count(*) FROM worker_samples").fetchone() == (5,)
    store.close()
