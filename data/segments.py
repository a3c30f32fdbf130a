"""Closed Parquet segments of the log, so that readers never contend with the writer.

DuckDB lets one process write a database file and locks it against every
other process, readers included. The process that writes the log (the replay,
or ``kvcost serve``) therefore rolls what it has appended into *closed*
Parquet segments — ``DIR/<table>/segment-<n>.parquet``, each written under a
temporary name and renamed into place, then recorded in ``DIR/segments.json``
(also replaced atomically) — and readers such as ``kvcost retrain`` read the
segments through an in-memory DuckDB, never the locked file. Segments are
append-only and never rewritten; a reader sees every segment listed in the
manifest it read, so it never sees half a segment.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import duckdb

from kvcost.data.store import SCHEMA, LogStore

MANIFEST = "segments.json"


def segments_dir_for(db: str | Path) -> Path:
    """Where the writer of log ``db`` rolls its segments: ``<db folder>/<db stem>-segments``."""
    db = Path(db)
    return db.parent / f"{db.stem}-segments"


def roll_segments(store: LogStore, out_dir: str | Path) -> list[Path]:
    """Export every table's rows appended since the last roll as new closed segments.

    Returns:
        The segment files written (none when nothing was appended).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = _read_manifest(out_dir)
    written: list[Path] = []
    con = store.connection
    for table in SCHEMA:
        exported = manifest["rows"].get(table, 0)
        total = con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]
        if total <= exported:
            continue
        index = len(manifest["segments"].get(table, []))
        path = out_dir / table / f"segment-{index:06d}.parquet"
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_suffix(".parquet.tmp")
        con.execute(
            f"COPY (SELECT * FROM {table} WHERE rowid >= {exported} AND rowid < {total}) TO '{tmp}' (FORMAT parquet)"
        ).fetchall()
        os.replace(tmp, path)
        manifest["segments"].setdefault(table, []).append(path.name)
        manifest["rows"][table] = total
        written.append(path)
    if written:
        _write_manifest(out_dir, manifest)
    return written


def connect_segments(segments_dir: str | Path) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with one view per table over the segments listed in the manifest.

    Raises:
        FileNotFoundError: no manifest (nothing rolled yet) in ``segments_dir``.
    """
    segments_dir = Path(segments_dir)
    if not (segments_dir / MANIFEST).exists():
        raise FileNotFoundError(f"{segments_dir}: no {MANIFEST}; no log segment has been rolled there yet")
    manifest = _read_manifest(segments_dir)
    con = duckdb.connect()
    for table, columns in SCHEMA.items():
        files = [str(segments_dir / table / name) for name in manifest["segments"].get(table, [])]
        if files:
            # union_by_name: segments rolled before a column was added (LogStore.open adds new
            # ones) read it as NULL instead of hiding it from every segment
            con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet({files!r}, union_by_name = true)")
        else:
            ddl = ", ".join(f"{c.name} {c.sql_type}" for c in columns)
            con.execute(f"CREATE TABLE {table} ({ddl})")
    return con


def _read_manifest(out_dir: Path) -> dict:
    path = out_dir / MANIFEST
    if not path.exists():
        return {"segments": {}, "rows": {}}
    return json.loads(path.read_text())


def _write_manifest(out_dir: Path, manifest: dict) -> None:
    tmp = out_dir / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    os.replace(tmp, out_dir / MANIFEST)
