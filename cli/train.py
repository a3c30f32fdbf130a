"""``kvcost train``: every TTFT term from the log, compared with the analytic model, registered as challenger."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvcost.cli.common import MlflowOpt, console, guard, print_table
from kvcost.data.store import DEFAULT_LOG_PATH

DbOpt = Annotated[Path, typer.Option(help="DuckDB log, appended to.")]
OutOpt = Annotated[Path | None, typer.Option(help="Output folder (default runs/<UTC timestamp>).")]


def train(
    db: DbOpt = DEFAULT_LOG_PATH,
    runs: Annotated[str | None, typer.Option(help="Comma-separated run ids (default: every run in the log).")] = None,
    predictor: Annotated[str, typer.Option(help="Term predictor: lightgbm, sklearn or analytic.")] = "lightgbm",
    mlflow_uri: MlflowOpt = None,
    out: OutOpt = None,
) -> None:
    """Train every TTFT term from the log, compare with the analytic model, register a challenger in MLflow."""
    from kvcost.models.train_job import METRIC_HEADER, metric_rows, run_training

    run_ids = [r.strip() for r in runs.split(",") if r.strip()] if runs else None
    with console.status("training"):
        outcome = guard(lambda: run_training(db, run_ids=run_ids, predictor=predictor, mlflow_uri=mlflow_uri, out=out))
    title = f"kvcost train — holdout of {outcome.evaluation['rows']} requests (MAPEs in the report)"
    mae_columns = METRIC_HEADER.index("MAPE learned")  # 80 columns hold six figures per term
    rows = [row[:mae_columns] for row in metric_rows(outcome.evaluation)]
    print_table(METRIC_HEADER[:mae_columns], rows, title)
    console.print(
        f"coverage of the 90 % TTFT bound: {outcome.evaluation['coverage_90']:.1%}; "
        f"registered kvcost-terms version {outcome.version} as challenger"
    )
    console.print(f"report: {Path(outcome.report['out']) / 'training.md'}")
