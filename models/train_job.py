"""``kvcost train``: read the log, train every term, evaluate against the analytic model, register in MLflow.

Writes ``training.json`` (metrics per term and for TTFT, learned and analytic
side by side, coverage, data window, registered version) next to
``training.md`` and a plot of predicted against actual TTFT on the holdout.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import duckdb

from kvcost.core.plots import plot_holdout_ttft
from kvcost.core.reporting import markdown_table, write_json
from kvcost.data.store import TERMS_AND_TTFT
from kvcost.models.mlflow_store import DEFAULT_TRACKING_URI, log_and_register
from kvcost.models.shift import MAX_UNCHOSEN_PER_CHOSEN, choice_shift_weights
from kvcost.models.term_set import TermModelSet
from kvcost.models.training import (
    evaluate,
    feature_matrix,
    load_training_frame,
    load_unchosen_features,
    split_by_time,
    train_term_set,
)


@dataclass(frozen=True)
class TrainingOutcome:
    """What ``kvcost train`` produced: the model set, its evaluation, the registered version."""

    model_set: TermModelSet
    evaluation: dict
    report: dict
    version: str | None


def run_training(
    db: Path,
    *,
    run_ids: Sequence[str] | None = None,
    predictor: str = "lightgbm",
    mlflow_uri: str | None = None,
    out: Path | None = None,
    train_fraction: float = 0.4,
    calibration_fraction: float = 0.2,
    register: bool = True,
) -> TrainingOutcome:
    """Train on the log ``db`` and (unless ``register`` is False) register a ``challenger`` version.

    The training rows are importance-weighted toward every candidate logged for their requests
    (:mod:`kvcost.models.shift`): the term models learn from the router's own choices only.

    Raises:
        FileNotFoundError, ValueError: missing log, no rows, bad fractions (messages name them).
    """
    frame = load_training_frame(db, run_ids)
    split = split_by_time(frame, train_fraction, calibration_fraction)
    unchosen = load_unchosen_features(db, split.train, MAX_UNCHOSEN_PER_CHOSEN * len(split.train))
    weights = choice_shift_weights(feature_matrix(split.train), unchosen)
    model_set = train_term_set(split, predictor, weights)
    evaluation = evaluate(model_set, split.holdout)
    config = {
        "db": str(db),
        "run_ids": list(run_ids) if run_ids else sorted(frame["run_id"].unique().tolist()),
        "predictor": predictor,
        "train_fraction": train_fraction,
        "calibration_fraction": calibration_fraction,
    }
    version = None
    if register:
        version = log_and_register(model_set, evaluation, split.holdout, config, mlflow_uri).version
    report = {
        **config,
        "mlflow_uri": mlflow_uri or DEFAULT_TRACKING_URI,
        "registered_version": version,
        "metadata": model_set.metadata,
        "evaluation": evaluation,
    }
    out = out if out is not None else Path("runs") / f"train-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "training.json", report)
    _plot_holdout(model_set, split.holdout, out / "holdout_ttft.png")
    (out / "training.md").write_text(training_markdown(report))
    return TrainingOutcome(model_set, evaluation, {**report, "out": str(out)}, version)


def metric_rows(evaluation: dict) -> list[list[str]]:
    """Rows ``term, learned MAE, analytic MAE, ratio, learned P90 |err|, analytic P90 |err|, MAPEs``."""
    rows = []
    for term in TERMS_AND_TTFT:
        learned, analytic = evaluation["learned"][term], evaluation["analytic"][term]
        ratio = learned["mae_s"] / analytic["mae_s"] if analytic["mae_s"] > 0 else float("nan")
        rows.append(
            [
                term,
                f"{learned['mae_s']:.4f}",
                f"{analytic['mae_s']:.4f}",
                f"{ratio:.2f}" if ratio == ratio else "–",
                f"{learned['p90_abs_error_s']:.4f}",
                f"{analytic['p90_abs_error_s']:.4f}",
                _pct(learned["mape"]),
                _pct(analytic["mape"]),
            ]
        )
    return rows


METRIC_HEADER = [
    "term",
    "MAE learned (s)",
    "MAE analytic (s)",
    "learned / analytic",
    "P90 |err| learned (s)",
    "P90 |err| analytic (s)",
    "MAPE learned",
    "MAPE analytic",
]


def _pct(value: float | None) -> str:
    return "–" if value is None or value != value else f"{value:.1%}"


def training_markdown(report: dict) -> str:
    """The training report: data, metrics table, coverage, registered version."""
    ev = report["evaluation"]
    meta = report["metadata"]
    return "\n".join(
        [
            f"# kvcost train — {report['predictor']}",
            "",
            f"- log `{report['db']}`, runs {', '.join(report['run_ids'])}",
            f"- rows: {meta['rows']} (time-ordered: train, calibration, holdout)",
            f"- feature spec {meta['feature_spec_hash']}; MLflow `{report['mlflow_uri']}`, "
            f"version {report['registered_version'] or '(not registered)'}",
            "",
            markdown_table(METRIC_HEADER, metric_rows(ev)),
            "",
            f"Coverage of the 90 % TTFT bound on the holdout: {ev['coverage_90']:.1%}. "
            "MAPE counts rows whose actual value exceeds 100 ms. Learned TTFT is the isotonic-recalibrated "
            "composition of the learned terms (the score `learned_cost_aware` routes by).",
            "",
            "![holdout TTFT](holdout_ttft.png)",
            "",
        ]
    )


def _plot_holdout(model_set: TermModelSet, holdout, path: Path) -> None:
    """Holdout TTFT predicted by the analytic model and by ``model_set`` (calibrated P50) against actual."""
    x = feature_matrix(holdout)
    predicted_s = {
        "analytic": TermModelSet.analytic().predict(x).ttft_s,
        "learned (calibrated)": model_set.calibrate(model_set.predict(x)).p50_s,
    }
    plot_holdout_ttft(holdout["actual_ttft_s"].to_numpy(), predicted_s, path)


def retrain_loop(
    db: Path,
    *,
    every_s: float,
    iterations: int | None = None,
    mlflow_uri: str | None = None,
    out_root: Path = Path("runs"),
    sleep: Callable[[float], None] = time.sleep,
    report: Callable[[str], None] = print,
) -> list[dict]:
    """The scheduled retraining job on wall-clock time: train, register a challenger, promote through the gate.

    Each round trains on everything in the log (read-only), registers the new
    version as ``challenger`` and promotes it to ``champion`` only if it passes
    :func:`~kvcost.models.mlflow_store.promote`'s gate. A log that cannot be read
    (missing, or locked by a writing process) is reported and retried next round;
    nothing stops the loop but ``iterations``. ``sleep`` is injected for tests.

    Returns:
        One record per round: ``round``, ``version`` (None when the log could not be read),
        ``promoted``, ``message``.
    """
    if not every_s > 0:
        raise ValueError(f"every_s = {every_s}, expected a number > 0")
    history: list[dict] = []
    round_no = 0
    while iterations is None or round_no < iterations:
        if round_no:
            sleep(every_s)
        round_no += 1
        history.append(_retrain_round(db, round_no, mlflow_uri, out_root / f"retrain-{round_no:04d}", report))
    return history


def _retrain_round(db: Path, round_no: int, mlflow_uri: str | None, out: Path, report: Callable[[str], None]) -> dict:
    from kvcost.models.mlflow_store import promote

    try:
        outcome = run_training(db, mlflow_uri=mlflow_uri, out=out)
    except (FileNotFoundError, ValueError, duckdb.Error) as exc:
        message = f"round {round_no}: log not readable, retrying next round: {str(exc).splitlines()[0]}"
        report(message)
        return {"round": round_no, "version": None, "promoted": False, "message": message}
    result = promote(mlflow_uri, outcome.version)
    maes = f"TTFT MAE on the challenger's holdout: challenger {result.challenger['ttft_mae_s']:.4f} s"
    if result.champion is not None:
        maes += f", champion {result.champion['ttft_mae_s']:.4f} s"
    else:  # the analytic model routes without a champion, and the gate compares with it
        maes += f", analytic {result.challenger['analytic_ttft_mae_s']:.4f} s"
    message = f"round {round_no}: {result.message} ({maes})"
    report(message)
    return {"round": round_no, "version": outcome.version, "promoted": result.promoted, "message": message}
