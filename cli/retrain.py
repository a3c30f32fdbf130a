"""``kvcost retrain``: scheduled retraining with promotion through the gate."""

from __future__ import annotations

from typing import Annotated

import typer

from kvcost.cli.common import MlflowOpt, console, guard
from kvcost.cli.train import DbOpt
from kvcost.data.store import DEFAULT_LOG_PATH


def retrain(
    every_s: Annotated[float, typer.Option(help="Seconds between retraining rounds (wall clock).")],
    db: DbOpt = DEFAULT_LOG_PATH,
    iterations: Annotated[
        int | None, typer.Option(min=1, help="Stop after this many rounds (default: run on).")
    ] = None,
    mlflow_uri: MlflowOpt = None,
) -> None:
    """Scheduled retraining: every S seconds train on the log, register a challenger, promote through the gate.

    --db is the DuckDB log, or — while another process writes it — the folder of
    closed Parquet segments its writer rolls (runs/kvcost-segments for runs/kvcost.duckdb).
    Exit status (with --iterations): 0 when the last round's challenger was promoted, 1 when
    the gate refused it, 3 when a round could not read the log (2: bad options).
    """
    from kvcost.models.train_job import retrain_loop

    history = guard(
        lambda: retrain_loop(db, every_s=every_s, iterations=iterations, mlflow_uri=mlflow_uri, report=console.print)
    )
    promoted = sum(r["promoted"] for r in history)
    unread = sum(r["version"] is None for r in history)
    console.print(f"{len(history)} round(s), {promoted} promotion(s), {unread} with the log not readable")
    if unread:
        raise typer.Exit(code=3)
    if history and not history[-1]["promoted"]:
        raise typer.Exit(code=1)
