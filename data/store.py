"""The DuckDB log: the one place where the schema of every table is defined.

Tables (all keyed by ``run_id``; one run = one configuration replayed or served):

* ``runs`` — one row per run: configuration name, trace, parameters (JSON), start time.
* ``requests`` — one row per request: identity, placement, predicted and actual
  reuse, the five predicted and actual TTFT terms and TTFT, TPOT, end-to-end
  latency, directory mismatch.
* ``candidates`` — one row per request × candidate worker: the feature row
  (``kvcost.features.spec.FEATURE_SPEC``, same names) and the predicted terms.
* ``worker_samples`` — each worker's queue and KV usage over time.
* ``block_events`` — KV block access history of each worker's pool (stored / hit / idle /
  evicted), the training data of the reuse classifier (:mod:`kvcost.models.reuse`).

The database is appended to, never overwritten. A log written by an older
kvcost gains the columns added since (``ALTER TABLE … ADD COLUMN``, NULL in
old rows); each run records the feature-spec hash its candidates were built
with, and training reads only runs of the current hash.
Writes are batched: every append is one :class:`TableBatch` (a column per
schema column) inserted with one ``INSERT … SELECT`` from an Arrow table
(:meth:`LogStore.append`), never row at a time; the typed rows of ``requests``
and ``candidates`` that the simulator and the service both build are in
:mod:`kvcost.data.log_rows`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import TracebackType

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa

from kvcost.core.composition import TERMS
from kvcost.features.spec import FEATURE_SPEC, feature_spec_hash

#: Where the CLI's commands and the service read and append the log unless told otherwise.
DEFAULT_LOG_PATH = Path("runs/kvcost.duckdb")


@dataclass(frozen=True, slots=True)
class Column:
    """One column: name (unit suffix in the name), DuckDB type, description."""

    name: str
    sql_type: str
    description: str


#: The five terms, then TTFT: the order of every predicted / actual vector of the log.
TERMS_AND_TTFT: tuple[str, ...] = (*TERMS, "ttft")
#: ``pred_<term>_s`` in :data:`TERMS_AND_TTFT` order (``requests`` and ``candidates``).
PRED_COLUMNS: tuple[str, ...] = tuple(f"pred_{t}_s" for t in TERMS_AND_TTFT)
#: ``actual_<term>_s`` in :data:`TERMS_AND_TTFT` order (``requests``).
ACTUAL_COLUMNS: tuple[str, ...] = tuple(f"actual_{t}_s" for t in TERMS_AND_TTFT)
#: Column of each term (and ``"ttft"``) in :data:`PRED_COLUMNS` / :data:`ACTUAL_COLUMNS`.
PRED_COLUMN: dict[str, str] = dict(zip(TERMS_AND_TTFT, PRED_COLUMNS, strict=True))
ACTUAL_COLUMN: dict[str, str] = dict(zip(TERMS_AND_TTFT, ACTUAL_COLUMNS, strict=True))


def _terms(names: tuple[str, ...], what: str) -> list[Column]:
    described = [f"{what} {t} term, seconds" for t in TERMS] + [f"{what} TTFT on the critical path, seconds"]
    return [Column(name, "DOUBLE", text) for name, text in zip(names, described, strict=True)]


RUN_ID = Column("run_id", "VARCHAR", "run identifier")
#: What an observation reports besides its terms (``requests`` and ``unjoined_observations``).
_OBSERVED = {
    "output_tokens": Column("output_tokens", "BIGINT", "generated tokens"),
    "actual_reuse_tokens": Column("actual_reuse_tokens", "BIGINT", "prefix actually reused at admission"),
    "tpot_s": Column("tpot_s", "DOUBLE", "mean time per output token after the first, seconds"),
    "e2e_s": Column("e2e_s", "DOUBLE", "arrival to last token at the client, seconds"),
}

SCHEMA: dict[str, tuple[Column, ...]] = {
    "runs": (
        RUN_ID,
        Column("configuration", "VARCHAR", "configuration name, e.g. balanced_cache"),
        Column("trace", "VARCHAR", "trace name or path"),
        Column("params_json", "VARCHAR", "every parameter of the run, JSON"),
        Column("started_at", "TIMESTAMP", "wall-clock start of the run (UTC)"),
        Column("feature_spec_hash", "VARCHAR", "hash of the feature spec of its candidates rows"),
    ),
    "requests": (
        RUN_ID,
        Column("request_id", "BIGINT", "0-based line number of the request in the trace file"),
        Column("arrival_s", "DOUBLE", "arrival time on the replay clock, seconds"),
        Column("worker_id", "BIGINT", "worker that served the request"),
        Column("input_tokens", "BIGINT", "prompt tokens"),
        _OBSERVED["output_tokens"],
        Column("predicted_reuse_tokens", "BIGINT", "reusable prefix the directory promised"),
        _OBSERVED["actual_reuse_tokens"],
        *_terms(PRED_COLUMNS, "predicted"),
        *_terms(ACTUAL_COLUMNS, "actual"),
        _OBSERVED["tpot_s"],
        _OBSERVED["e2e_s"],
        Column("directory_mismatch_tokens", "BIGINT", "promised reuse that was gone at admission"),
        Column("mismatch_lost_s", "DOUBLE", "nominal prefill time of the mismatch tokens, seconds"),
        Column("served_by", "VARCHAR", "prefix source: local_hit, tier_load, remote_transfer, recompute"),
        Column(
            "directory_reuse_tokens",
            "BIGINT",
            "gateway: prefix the directory held on the chosen worker at decision time (no in-flight prefixes), "
            "capped as the engine caps a full hit; NULL in replays",
        ),
        Column("client_request_id", "VARCHAR", "the client's request id (gateway: X-Request-Id or request_id)"),
        Column("outcome", "VARCHAR", "gateway: ok, or what ended the request (naming the engine); NULL in replays"),
        Column(
            "kv_wait_s",
            "DOUBLE",
            "replay: time at the head of the queue, with prefill budget left, that KV memory kept the request "
            "out before its first token, seconds (part of actual_queue_s); NULL from the gateway",
        ),
        Column("preemptions", "BIGINT", "replay: times the request was preempted (KV full); NULL from the gateway"),
    ),
    "unjoined_observations": (
        Column("run_id", "VARCHAR", "the serve run that received the observation"),
        Column("request_id", "BIGINT", "the client's request id, which no decision in memory or in the log has"),
        Column("received_s", "DOUBLE", "when the service received it, epoch seconds"),
        *_terms(ACTUAL_COLUMNS, "actual"),
        *_OBSERVED.values(),
    ),
    "candidates": (
        RUN_ID,
        Column("request_id", "BIGINT", "request, as in requests.request_id"),
        Column("worker_id", "BIGINT", "candidate worker"),
        Column("chosen", "BOOLEAN", "whether the router chose this candidate"),
        *(Column(f.name, f.dtype, f"{f.description} ({f.unit})") for f in FEATURE_SPEC),
        *_terms(PRED_COLUMNS, "predicted"),
    ),
    "worker_samples": (
        RUN_ID,
        Column("t_s", "DOUBLE", "sample time on the replay clock, seconds"),
        Column("worker_id", "BIGINT", "worker"),
        Column("waiting_requests", "BIGINT", "requests not done with prefill"),
        Column("running_requests", "BIGINT", "requests in decode"),
        Column("queued_prefill_tokens", "BIGINT", "prefill tokens left in the queue"),
        Column("kv_usage", "DOUBLE", "KV blocks used by running requests / capacity"),
        Column("idle_cached_blocks", "BIGINT", "cached blocks with refcount 0"),
    ),
    "block_events": (
        RUN_ID,
        Column("worker_id", "BIGINT", "worker whose pool logged the event"),
        Column("t_s", "DOUBLE", "event time on the replay clock, seconds"),
        Column("block_hash", "UBIGINT", "block hash (64-bit, chained over the prefix)"),
        Column("event", "VARCHAR", "stored (computed and cached), hit (reused), idle (refcount 0), evicted"),
        Column("depth_blocks", "BIGINT", "0-based position of the block in its prefix"),
        Column("request_blocks", "BIGINT", "full prompt blocks of the request involved (0 for evicted)"),
        Column("reused_blocks", "BIGINT", "leading blocks that request found cached at admission (0 for evicted)"),
    ),
}


def schema_markdown() -> str:
    """The schema as a Markdown list of tables and columns (for the README and reports)."""
    lines: list[str] = []
    for table, columns in SCHEMA.items():
        lines.append(f"- `{table}`: " + ", ".join(f"`{c.name}` {c.sql_type}" for c in columns))
    return "\n".join(lines)


#: A DuckDB database file's magic bytes and their offset (after its 8-byte checksum; DuckDB's storage format).
DUCKDB_MAGIC, DUCKDB_MAGIC_OFFSET = b"DUCK", 8


def check_duckdb_file(path: Path) -> None:
    """Refuse an existing file that is not a DuckDB database (a path that does not exist becomes one):
    ``duckdb.connect`` accepted a trace given as ``--db`` by mistake, and the rows went only to its
    segments folder.

    Raises:
        duckdb.IOException: names the file and what its first bytes should hold.
    """
    if not path.is_file():
        return
    with path.open("rb") as file:
        head = file.read(DUCKDB_MAGIC_OFFSET + len(DUCKDB_MAGIC))
    if head[DUCKDB_MAGIC_OFFSET:] != DUCKDB_MAGIC:
        raise duckdb.IOException(f"{path} is not a DuckDB database file (no {DUCKDB_MAGIC!r} header)")


class LogStore:
    """Append-only DuckDB log.

    Construction is pure; :meth:`open` connects and creates missing tables.
    Use as a context manager::

        with LogStore(path).open() as store:
            store.write_run(...)
            store.write_frame("requests", run_id, frame)

    Thread safety: one connection, one thread.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._con: duckdb.DuckDBPyConnection | None = None

    def open(self) -> LogStore:
        """Connect (creating the file and its folder) and create or check the tables.

        Raises:
            duckdb.Error: the file is not a DuckDB database or is locked by another process.
        """
        check_duckdb_file(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._con = duckdb.connect(str(self.path))
        for table, columns in SCHEMA.items():
            ddl = ", ".join(f"{c.name} {c.sql_type}" for c in columns)
            self._con.execute(f"CREATE TABLE IF NOT EXISTS {table} ({ddl})")
            have = {row[0] for row in self._con.execute(f"DESCRIBE {table}").fetchall()}
            for column in columns:
                if column.name not in have:
                    self._con.execute(f"ALTER TABLE {table} ADD COLUMN {column.name} {column.sql_type}")
        return self

    @property
    def connection(self) -> duckdb.DuckDBPyConnection:
        """The open connection (for reads). Raises RuntimeError if not open."""
        if self._con is None:
            raise RuntimeError("LogStore is not open; call open() first")
        return self._con

    def close(self) -> None:
        """Close the connection (idempotent)."""
        if self._con is not None:
            self._con.close()
            self._con = None

    def __enter__(self) -> LogStore:
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def write_run(self, run_id: str, configuration: str, trace: str, params: dict, started_at: datetime) -> None:
        """Insert one ``runs`` row; ``params`` must be JSON-serialisable."""
        self.connection.execute(
            "INSERT INTO runs (run_id, configuration, trace, params_json, started_at, feature_spec_hash) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            [run_id, configuration, trace, json.dumps(params, sort_keys=True), started_at, feature_spec_hash()],
        )

    def write_frame(self, table: str, run_id: str, frame: pd.DataFrame) -> int:
        """Append ``frame`` (the table's columns without ``run_id``, any order) in one batch, all rows of ``run_id``.

        Returns:
            Rows written.

        Raises:
            KeyError: unknown table.
            ValueError: a schema column is missing from ``frame`` or ``frame`` has extra columns.
        """
        return self.append(TableBatch.from_frame(table, run_id, frame))

    def append(self, batch: TableBatch) -> int:
        """Append ``batch``: one ``INSERT … SELECT`` from an Arrow table typed by :data:`SCHEMA` (the one write path).

        NaN and None are NULL; a float column of an integer type is rounded to
        the nearest integer first. The simulator's log (:meth:`write_frame`) and
        the scoring service's log writer (:class:`kvcost.data.log_writer.LogWriter`)
        both write through here.

        Returns:
            Rows written.
        """
        arrow = batch.arrow()
        con = self.connection
        con.register("_kvcost_batch", arrow)
        try:
            cols = ", ".join(arrow.column_names)
            con.execute(f"INSERT INTO {batch.table} ({cols}) SELECT {cols} FROM _kvcost_batch")
        finally:
            con.unregister("_kvcost_batch")
        return arrow.num_rows

    def read_block_events(self, run_id: str) -> pd.DataFrame:
        """The ``block_events`` rows of ``run_id`` (without ``run_id``), in logged order per worker."""
        names = ", ".join(c.name for c in SCHEMA["block_events"] if c.name != "run_id")
        sql = f"SELECT {names} FROM block_events WHERE run_id = ? ORDER BY worker_id, rowid"
        return self.connection.execute(sql, [run_id]).df()

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """``BEGIN`` … ``COMMIT`` (``ROLLBACK`` and re-raise on error); the commit is durable when it returns.

        DuckDB syncs its write-ahead log on commit (``fdatasync``), so rows
        committed here survive a crash of the process or of the machine.
        """
        con = self.connection
        con.begin()
        try:
            yield con
        except BaseException:
            con.rollback()
            raise
        con.commit()


#: Arrow type of each DuckDB column type used in :data:`SCHEMA`.
_ARROW_TYPES = {
    "VARCHAR": pa.string(),
    "BIGINT": pa.int64(),
    "UBIGINT": pa.uint64(),
    "DOUBLE": pa.float64(),
    "BOOLEAN": pa.bool_(),
    "TIMESTAMP": pa.timestamp("us"),
}


@dataclass(frozen=True, slots=True)
class TableBatch:
    """Rows of one table, column by column: the unit every append writes (:meth:`LogStore.append`).

    Attributes:
        table: a table of :data:`SCHEMA`.
        columns: every column of the table, ``run_id`` included, by name: a numpy
            array or a sequence (``None`` is NULL), all of one length (rows may
            belong to several runs).

    Raises:
        KeyError: unknown table.
        ValueError: a column is missing or unexpected, or a column's length differs from the first's
            (the message names the column and both lengths).
    """

    table: str
    columns: Mapping[str, Sequence | np.ndarray]

    def __post_init__(self) -> None:
        if self.table not in SCHEMA:
            raise KeyError(f"unknown table {self.table!r}; expected one of {', '.join(SCHEMA)}")
        names = [c.name for c in SCHEMA[self.table]]
        missing = [n for n in names if n not in self.columns]
        extra = [n for n in self.columns if n not in names]
        if missing or extra:
            raise ValueError(f"columns for {self.table}: missing {missing}, unexpected {extra}")
        first = names[0]
        for name in names[1:]:
            if len(self.columns[name]) != len(self.columns[first]):
                raise ValueError(
                    f"columns for {self.table}: {name} has {len(self.columns[name])} rows, "
                    f"expected {len(self.columns[first])} (as {first})"
                )

    @property
    def num_rows(self) -> int:
        """Rows in the batch."""
        return len(self.columns["run_id"])

    @classmethod
    def from_frame(cls, table: str, run_id: str, frame: pd.DataFrame) -> TableBatch:
        """The rows of ``frame`` (the table's columns without ``run_id``, any order), all of ``run_id``.

        Raises:
            KeyError: unknown table.
            ValueError: a schema column is missing from ``frame`` or ``frame`` has extra columns.
        """
        if table not in SCHEMA:
            raise KeyError(f"unknown table {table!r}; expected one of {', '.join(SCHEMA)}")
        names = [c.name for c in SCHEMA[table] if c.name != "run_id"]
        missing = [n for n in names if n not in frame.columns]
        extra = [n for n in frame.columns if n not in names]
        if missing or extra:
            raise ValueError(f"frame for {table}: missing columns {missing}, unexpected columns {extra}")
        columns = {"run_id": np.full(len(frame), run_id, dtype=object)}
        return cls(table, columns | {n: frame[n].to_numpy() for n in names})

    @classmethod
    def concat(cls, batches: Sequence[TableBatch]) -> TableBatch:
        """The rows of ``batches`` (one table, at least one batch) in order: arrays concatenated, else lists joined.

        Raises:
            ValueError: no batch, or batches of different tables.
        """
        if not batches:
            raise ValueError("batches is empty; expected at least one TableBatch")
        tables = {b.table for b in batches}
        if len(tables) > 1:
            raise ValueError(f"batches of several tables {sorted(tables)}; expected one")
        if len(batches) == 1:
            return batches[0]
        merged: dict[str, Sequence | np.ndarray] = {}
        for name in batches[0].columns:
            parts = [b.columns[name] for b in batches]
            if all(isinstance(p, np.ndarray) for p in parts):
                merged[name] = np.concatenate(parts)
            else:
                merged[name] = [v for p in parts for v in p]
        return cls(batches[0].table, merged)

    def arrow(self) -> pa.Table:
        """The batch as an Arrow table typed by :data:`SCHEMA`, in schema column order."""
        return pa.table({c.name: _arrow_array(self.columns[c.name], c.sql_type) for c in SCHEMA[self.table]})


def _arrow_array(values: Sequence | np.ndarray, sql_type: str) -> pa.Array:
    """``values`` as an Arrow array of ``sql_type``'s type; NaN and None are null, integer columns' floats rounded."""
    arrow_type = _ARROW_TYPES[sql_type]
    if isinstance(values, np.ndarray) and values.dtype.kind == "f" and pa.types.is_integer(arrow_type):
        values = np.rint(values)
    return pa.array(values, type=arrow_type, from_pandas=True)
