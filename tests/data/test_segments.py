"""Closed Parquet segments: a reader trains from them while another process holds the log open for writing."""

import subprocess
import sys
import textwrap

import duckdb
import pytest

from kvcost.data.segments import connect_segments, roll_segments
from kvcost.data.store import LogStore
from kvcost.models.training import load_training_frame

from .test_store import _samples

# A writer process: opens the log (DuckDB's write lock), appends a simulated run in 4 batches of requests
# and candidates, rolling segments after each batch and waiting for the reader before the next one.
_WRITER = textwrap.dedent(
    """
    import sys, time
    from datetime import datetime
    import pandas as pd
    from kvcost.data.store import LogStore
    from kvcost.data.segments import roll_segments
    sys.path.insert(0, sys.argv[3])
    from tests.models.test_training import _candidates, _requests
    db, segments = sys.argv[1], sys.argv[2]
    with LogStore(db).open() as store:
        store.write_run("w", "serve", "live", {}, datetime(2026, 1, 1))
        for batch in range(4):
            ids = list(range(batch * 10, batch * 10 + 10))
            store.write_frame("requests", "w", _requests(ids, [float(i) for i in ids], [0.1 * i for i in ids]))
            store.write_frame("candidates", "w", _candidates(ids))
            roll_segments(store, segments)
            print(f"rolled {batch}", flush=True)
            sys.stdin.readline()  # lockstep: the reader checks this batch while the log stays locked
    """
)


@pytest.mark.slow
def test_reader_trains_on_segments_while_the_writer_holds_the_log(tmp_path):
    db, segments = tmp_path / "log.duckdb", tmp_path / "segments"
    root = str(__import__("pathlib").Path(__file__).resolve().parents[2])
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(db), str(segments), root],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        for batch in range(4):
            assert writer.stdout.readline().strip() == f"rolled {batch}"
            frame = load_training_frame(segments)  # reads the closed segments, not the locked file
            assert len(frame) == 10 * (batch + 1)
            with pytest.raises(duckdb.Error):
                duckdb.connect(str(db), read_only=True)  # the live log itself is locked by the writer
            writer.stdin.write("\n")
            writer.stdin.flush()
        assert frame["request_id"].tolist() == list(range(40))
    finally:
        writer.stdin.close()
        writer.wait(timeout=30)
    assert writer.returncode == 0


def test_roll_is_incremental_and_atomic(tmp_path):
    with LogStore(tmp_path / "log.duckdb").open() as store:
        store.write_frame("worker_samples", "r", _samples(3))
        first = roll_segments(store, tmp_path / "seg")
        assert [p.name for p in first] == ["segment-000000.parquet"]
        assert roll_segments(store, tmp_path / "seg") == []  # nothing new
        store.write_frame("worker_samples", "r", _samples(2))
        second = roll_segments(store, tmp_path / "seg")
    assert [p.name for p in second] == ["segment-000001.parquet"]
    assert not list((tmp_path / "seg").rglob("*.tmp"))
    con = connect_segments(tmp_path / "seg")
    assert con.execute("SELECT count(*) FROM worker_samples").fetchone() == (5,)
    assert con.execute("SELECT count(*) FROM requests").fetchone() == (0,)  # never rolled: empty table


def test_no_manifest_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no segments.json"):
        connect_segments(tmp_path)


def test_a_column_added_after_earlier_segments_reads_as_null_there(tmp_path):
    # an older kvcost rolled segment 0 without kv_usage; the current one rolled segment 1 with it
    import json

    import pandas as pd

    (tmp_path / "worker_samples").mkdir()
    pd.DataFrame({"run_id": ["a"], "t_s": [1.0]}).to_parquet(tmp_path / "worker_samples" / "0.parquet")
    pd.DataFrame({"run_id": ["b"], "t_s": [2.0], "kv_usage": [0.5]}).to_parquet(
        tmp_path / "worker_samples" / "1.parquet"
    )
    manifest = {"segments": {"worker_samples": ["0.parquet", "1.parquet"]}, "rows": {}}
    (tmp_path / "segments.json").write_text(json.dumps(manifest))
    with connect_segments(tmp_path) as con:
        rows = con.execute("SELECT run_id, kv_usage FROM worker_samples ORDER BY t_s").fetchall()
    assert rows == [("a", None), ("b", 0.5)]
