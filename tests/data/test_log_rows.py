"""Tests of kvcost.data.log_rows: typed requests rows and candidates batches, round-tripped through a DuckDB file."""

from datetime import datetime

import numpy as np
import pytest

from kvcost.core.composition import TermPredictions
from kvcost.core.types import DirectoryMatch, RouteDecision
from kvcost.data.log_rows import (
    CandidateBatch,
    CandidateLog,
    RequestRow,
    read_chosen_candidates,
    request_batch,
    request_columns,
    requests_frame,
)
from kvcost.data.store import ACTUAL_COLUMNS, PRED_COLUMNS, SCHEMA, TERMS_AND_TTFT, LogStore, TableBatch
from kvcost.features.spec import FEATURE_NAMES

N_FEATURES = len(FEATURE_NAMES)


def _row(request_id, **changes):
    fields = {
        "request_id": request_id,
        "arrival_s": 1.5,
        "worker_id": 2,
        "input_tokens": 100,
        "output_tokens": 10,
        "predicted_reuse_tokens": 64,
        "actual_reuse_tokens": 32,
        "predicted_s": (0.1, 0.0, 0.0, 0.5, 0.01, 0.61),
        "actual_s": (0.2, 0.0, 0.0, 0.6, 0.01, 0.81),
        "tpot_s": 0.02,
        "e2e_s": 1.0,
        "directory_mismatch_tokens": 32,
        "mismatch_lost_s": 0.05,
        "served_by": "local_hit",
    }
    return RequestRow(**(fields | changes))


def test_term_column_names_come_from_terms_once():
    assert TERMS_AND_TTFT == ("queue", "lookup", "transfer", "prefill", "first_token", "ttft")
    assert PRED_COLUMNS[0] == "pred_queue_s" and ACTUAL_COLUMNS[-1] == "actual_ttft_s"
    requests = [c.name for c in SCHEMA["requests"]]
    assert requests[8:20] == [*PRED_COLUMNS, *ACTUAL_COLUMNS]
    assert [c.name for c in SCHEMA["candidates"]][-6:] == list(PRED_COLUMNS)


def test_request_rows_round_trip_through_duckdb_with_nulls(tmp_path):
    observed = _row(7, actual_s=(None, None, None, None, None, 0.3), output_tokens=None, served_by=None)
    observed = observed._replace(actual_reuse_tokens=None, directory_mismatch_tokens=None, mismatch_lost_s=None)
    rows = [_row(5, tpot_s=float("nan"), client_request_id="chat-1", outcome="ok"), observed]
    with LogStore(tmp_path / "log.duckdb").open() as store:
        assert store.append(request_batch(["r1", "r2"], rows)) == 2
    with LogStore(tmp_path / "log.duckdb").open() as store:
        got = store.connection.execute("SELECT * FROM requests ORDER BY request_id").fetchall()
    assert got[0] == ("r1", 5, 1.5, 2, 100, 10, 64, 32, 0.1, 0.0, 0.0, 0.5, 0.01, 0.61) + (
        0.2, 0.0, 0.0, 0.6, 0.01, 0.81, None, 1.0, 32, 0.05, "local_hit", None, "chat-1", "ok", None, None,
    )  # fmt: skip
    assert got[1] == ("r2", 7, 1.5, 2, 100, None, 64, None, 0.1, 0.0, 0.0, 0.5, 0.01, 0.61) + (
        None, None, None, None, None, 0.3, 0.02, 1.0, None, None, None, None, None, None, None, None,
    )  # fmt: skip


def test_request_columns_are_typed_in_schema_order():
    columns = request_columns([_row(1), _row(2, worker_id=3)])
    assert list(columns) == [c.name for c in SCHEMA["requests"][1:]]
    assert columns["worker_id"].dtype == np.int64 and columns["worker_id"].tolist() == [2, 3]
    assert columns["pred_prefill_s"].tolist() == [0.5, 0.5] and columns["served_by"].dtype == object
    assert columns["actual_reuse_tokens"].tolist() == [32, 32]
    assert request_columns([_row(1, output_tokens=None)])["output_tokens"] == [None]  # a NULL integer stays a list
    frame = requests_frame([])
    assert len(frame) == 0 and list(frame.columns) == list(columns)


def test_a_missing_term_is_named():
    short = _row(9, predicted_s=(0.1, 0.0, 0.0, 0.5, 0.61))
    with pytest.raises(ValueError, match=r"RequestRow.predicted_s of request_id 9 has 5 values, expected 6 \(queue, "):
        request_columns([_row(1), short])
    with pytest.raises(ValueError, match=r"RequestRow.actual_s of request_id 4 has 7 values, expected 6"):
        request_columns([_row(4, actual_s=(0.0,) * 7)])


def _decision(request_id, worker_ids, chosen_index):
    n = len(worker_ids)
    terms = [np.arange(n, dtype=float) + k for k in range(5)]  # TTFT = max(Q, X) + L + P + F: 10, 14, 18 …
    return RouteDecision(
        request_id=request_id,
        worker_id=worker_ids[chosen_index],
        chosen_index=chosen_index,
        worker_ids=tuple(worker_ids),
        reason="test",
        matches=tuple(DirectoryMatch(w, 0, "none", 0.0) for w in worker_ids),
        reusable_tokens=np.zeros(n, dtype=np.int64),
        features=np.full((n, N_FEATURES), 2.4) + np.arange(n)[:, None],
        predictions=TermPredictions(*terms),
    )


def test_candidate_batch_round_trips_through_duckdb(tmp_path):
    batch = CandidateBatch.of_decision(_decision(11, (4, 6), 1))
    assert batch.request_id.tolist() == [11, 11] and batch.chosen.tolist() == [False, True]
    assert batch.predicted_s.tolist() == [[0, 1, 2, 3, 4, 10], [1, 2, 3, 4, 5, 14]]
    with LogStore(tmp_path / "log.duckdb").open() as store:
        assert store.append(batch.batch("r")) == 2
        got = store.connection.execute(
            f"SELECT run_id, request_id, worker_id, chosen, {FEATURE_NAMES[0]}, pred_queue_s, pred_ttft_s "
            "FROM candidates ORDER BY worker_id"
        ).fetchall()
    feature_type = SCHEMA["candidates"][4].sql_type
    first = 2 if feature_type == "BIGINT" else 2.4  # an integer feature column is rounded on the way in
    second = 3 if feature_type == "BIGINT" else 3.4
    assert got == [("r", 11, 4, False, first, 0.0, 10.0), ("r", 11, 6, True, second, 1.0, 14.0)]


def test_candidate_log_stacks_decisions_in_order():
    log = CandidateLog()
    for decision in (_decision(7, (0, 1, 2), 2), _decision(9, (3, 1), 0)):
        log.add(decision, decision.predictions.as_matrix())
    batch = log.batch()
    assert batch.request_id.tolist() == [7, 7, 7, 9, 9]
    assert batch.worker_id.tolist() == [0, 1, 2, 3, 1]
    assert batch.chosen.tolist() == [False, False, True, True, False]
    assert batch.features[:, 0].tolist() == [2.4, 3.4, 4.4, 2.4, 3.4]
    frame = batch.frame()
    assert list(frame.columns) == [c.name for c in SCHEMA["candidates"][1:]]
    assert frame["pred_ttft_s"].tolist() == [10.0, 14.0, 18.0, 10.0, 14.0]
    assert CandidateLog().batch().frame().shape == (0, len(SCHEMA["candidates"]) - 1)


def test_candidate_batch_names_the_field_of_wrong_length_or_width():
    ok = CandidateBatch.of_decision(_decision(1, (0, 1, 2), 0))
    with pytest.raises(ValueError, match=r"CandidateBatch.worker_id has 2 rows, expected 3"):
        CandidateBatch(ok.request_id, ok.worker_id[:2], ok.chosen, ok.features, ok.predicted_s)
    with pytest.raises(ValueError, match=r"CandidateBatch.predicted_s has shape \(3, 5\), expected \(3, 6\): terms"):
        CandidateBatch(ok.request_id, ok.worker_id, ok.chosen, ok.features, ok.predicted_s[:, :5])


def test_table_batch_names_missing_and_short_columns():
    columns = {"run_id": ["r"], "t_s": [0.0], "worker_id": [0], "kv_usage": [0.5]}
    columns |= {n: [1] for n in ("waiting_requests", "running_requests", "queued_prefill_tokens")}
    with pytest.raises(ValueError, match=r"columns for worker_samples: missing \['idle_cached_blocks'\], unexpected"):
        TableBatch("worker_samples", columns)
    with pytest.raises(ValueError, match=r"worker_samples: worker_id has 2 rows, expected 1 \(as run_id\)"):
        TableBatch("worker_samples", columns | {"idle_cached_blocks": [0], "worker_id": [0, 1]})
    with pytest.raises(KeyError, match="unknown table 'nope'"):
        TableBatch("nope", columns)
    merged = TableBatch.concat([TableBatch("worker_samples", columns | {"idle_cached_blocks": [3]})] * 2)
    assert merged.num_rows == 2 and merged.columns["idle_cached_blocks"] == [3, 3]


def test_read_chosen_candidates_newest_first_reversed_and_observed(tmp_path):
    with LogStore(tmp_path / "log.duckdb").open() as store:
        store.write_run("old", "serve", "live", {}, datetime(2026, 1, 1))
        store.write_run("new", "serve", "live", {}, datetime(2026, 1, 2))
        store.write_run("sim", "balanced", "t", {}, datetime(2026, 1, 3))
        for run_id, request_id in (("old", 1), ("old", 2), ("new", 3), ("sim", 4)):
            store.append(CandidateBatch.of_decision(_decision(request_id, (5, 6), 1)).batch(run_id))
        store.append(request_batch("old", [_row(2)]))
        chosen = read_chosen_candidates(store, "serve", limit=2)
    assert [(c.run_id, c.request_id, c.worker_id, c.observed) for c in chosen] == [
        ("old", 2, 6, True),
        ("new", 3, 6, False),
    ]
    assert chosen[0].predicted_s == (1.0, 2.0, 3.0, 4.0, 5.0, 14.0)
