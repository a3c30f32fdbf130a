"""Training data from the DuckDB log, time-ordered splits, per-term training and evaluation.

A training row is one *chosen* candidate: its feature row (logged at decision
time) joined with the request's actual terms (logged at completion). Rows are
ordered by arrival and split by time — earlier rows train, a later slice
calibrates, the latest rows are held out — never shuffled across time.

Metrics (per term and for TTFT): MAE, P90 absolute error, and MAPE over the
rows whose actual value exceeds 100 ms (small values make percentages
meaningless), for the learned predictors and the analytic baseline side by
side.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

from kvcost.calibration.conformal import SplitConformal
from kvcost.calibration.isotonic import IsotonicCalibrator
from kvcost.core.composition import TERMS
from kvcost.data.segments import connect_segments
from kvcost.data.store import ACTUAL_COLUMN, ACTUAL_COLUMNS, TERMS_AND_TTFT
from kvcost.features.spec import FEATURE_NAMES, feature_spec_hash
from kvcost.models.predictors import make_term_predictor
from kvcost.models.shift import effective_rows
from kvcost.models.term_set import TermModelSet

#: Rows with an actual value above this enter the MAPE (seconds).
MAPE_FLOOR_S = 0.1


@dataclass(frozen=True)
class TimeSplit:
    """Row ranges of a time-ordered frame: ``[0, train_end)``, ``[train_end, calib_end)``, ``[calib_end, n)``."""

    train: pd.DataFrame
    calibration: pd.DataFrame
    holdout: pd.DataFrame


def load_training_frame(db: str | Path, run_ids: Sequence[str] | None = None) -> pd.DataFrame:
    """Chosen candidates joined with their requests' actual terms, ordered by (arrival, run, request).

    Args:
        db: DuckDB log path (opened read-only), or a folder of closed Parquet
            segments rolled by the writer (:mod:`kvcost.data.segments`), which can
            be read while another process holds the log open for writing.
        run_ids: restrict to these runs; None = every run in the log.

    Returns:
        One row per completed request: ``run_id``, ``request_id``, ``arrival_s``,
        ``worker_id``, the FEATURE_NAMES columns, the analytic ``pred_*_s`` columns
        and the ``actual_*_s`` columns.

    Raises:
        FileNotFoundError: no such database. ValueError: no rows (names the runs asked for).
    """
    if not Path(db).exists():
        raise FileNotFoundError(f"db = {str(db)!r} does not exist; run `kvcost experiment` to create a log")
    feature_cols = ", ".join(f"c.{name}" for name in FEATURE_NAMES)
    actual_cols = ", ".join(f"r.{name}" for name in ACTUAL_COLUMNS)
    where = "c.chosen AND c.run_id IN (SELECT run_id FROM runs WHERE feature_spec_hash = ?)"
    params: list = [feature_spec_hash()]
    if run_ids:
        where += f" AND c.run_id IN ({', '.join('?' for _ in run_ids)})"
        params += list(run_ids)
    sql = f"""
        SELECT c.run_id, c.request_id, r.arrival_s, c.worker_id, {feature_cols}, {actual_cols}
        FROM candidates c JOIN requests r ON c.run_id = r.run_id AND c.request_id = r.request_id
        WHERE {where}
        ORDER BY r.arrival_s, c.run_id, c.request_id
    """
    connect = connect_segments if Path(db).is_dir() else (lambda p: duckdb.connect(str(p), read_only=True))
    with connect(db) as con:
        frame = con.execute(sql, params).df()
    if frame.empty:
        runs = f"runs {list(run_ids)}" if run_ids else "any run"
        raise ValueError(
            f"db = {str(db)!r} has no completed requests for {runs} logged with feature spec {feature_spec_hash()}"
        )
    return frame


def load_unchosen_features(db: str | Path, train: pd.DataFrame, limit: int) -> np.ndarray:
    """Feature rows of the candidates not chosen for the requests of ``train`` (a slice of
    :func:`load_training_frame`), at most ``limit`` (a seeded sample), float64 ``(m, len(FEATURE_NAMES))``.

    The reference of the importance weights (:func:`~kvcost.models.shift.choice_shift_weights`).
    Raises FileNotFoundError for a missing ``db`` (as :func:`load_training_frame`).
    """
    if not Path(db).exists():
        raise FileNotFoundError(f"db = {str(db)!r} does not exist; run `kvcost experiment` to create a log")
    if train.empty or limit <= 0:
        return np.empty((0, len(FEATURE_NAMES)))
    keys = pd.DataFrame({"run_id": train["run_id"].astype(str), "request_id": train["request_id"].astype("int64")})
    feature_cols = ", ".join(f"c.{name}" for name in FEATURE_NAMES)
    sql = f"""
        SELECT {feature_cols} FROM candidates c JOIN keys k ON c.run_id = k.run_id AND c.request_id = k.request_id
        WHERE NOT c.chosen ORDER BY hash(c.run_id, c.request_id, c.worker_id) LIMIT {int(limit)}
    """
    connect = connect_segments if Path(db).is_dir() else (lambda p: duckdb.connect(str(p), read_only=True))
    with connect(db) as con:
        con.register("keys", keys)
        return con.execute(sql).df().to_numpy(dtype=np.float64)


def split_by_time(frame: pd.DataFrame, train_fraction: float = 0.4, calibration_fraction: float = 0.2) -> TimeSplit:
    """Split a time-ordered frame: first ``train_fraction`` trains, the next ``calibration_fraction`` calibrates.

    The default (0.4, 0.2) trains and calibrates on the first 60 % and holds out
    the last 40 %. A calibration slice of 20 % (rather than 10 %) spans more of
    the trace's load swings, so the 90 % bound's holdout coverage comes closer
    to 90 % (figures: ``docs/term-models.md``).

    Raises:
        ValueError: fractions outside (0, 1) or summing to ≥ 1, or a slice with no rows.
    """
    if not (0 < train_fraction < 1 and 0 < calibration_fraction < 1 and train_fraction + calibration_fraction < 1):
        raise ValueError(
            f"train_fraction = {train_fraction}, calibration_fraction = {calibration_fraction}, "
            "expected both in (0, 1) with a sum below 1"
        )
    n = len(frame)
    train_end = int(n * train_fraction)
    calib_end = int(n * (train_fraction + calibration_fraction))
    if train_end == 0 or calib_end == train_end or calib_end == n:
        raise ValueError(f"{n} rows are too few to split {train_fraction}/{calibration_fraction}/rest")
    return TimeSplit(frame.iloc[:train_end], frame.iloc[train_end:calib_end], frame.iloc[calib_end:])


def feature_matrix(frame: pd.DataFrame) -> np.ndarray:
    """float64 ``(n, len(FEATURE_SPEC))`` in FEATURE_NAMES order."""
    return frame.loc[:, list(FEATURE_NAMES)].to_numpy(dtype=np.float64)


def error_metrics(predicted_s: np.ndarray, actual_s: np.ndarray) -> dict[str, float]:
    """``mae_s``, ``p90_abs_error_s`` and ``mape`` (over actual > 100 ms; NaN if none) of one prediction.

    All three are NaN for no rows (a term that no holdout row observed).
    """
    if len(actual_s) == 0:
        return {"mae_s": float("nan"), "p90_abs_error_s": float("nan"), "mape": float("nan")}
    err = np.abs(np.asarray(predicted_s, dtype=float) - np.asarray(actual_s, dtype=float))
    big = actual_s > MAPE_FLOOR_S
    mape = float(np.mean(err[big] / actual_s[big])) if big.any() else float("nan")
    return {"mae_s": float(err.mean()), "p90_abs_error_s": float(np.quantile(err, 0.9)), "mape": mape}


def prediction_block(db: str | Path, run_ids: Sequence[str], predictor: str = "lightgbm") -> dict:
    """``summary.json``'s ``prediction``: holdout MAE per term and TTFT, analytic vs learned, and coverage.

    Trains on the first 60 % of the given runs' requests (40 % train, 20 %
    calibration) and evaluates on the last 40 %.
    """
    split = split_by_time(load_training_frame(db, run_ids))
    evaluation = evaluate(train_term_set(split, predictor), split.holdout)
    terms = TERMS_AND_TTFT
    return {
        "holdout_rows": evaluation["rows"],
        "mae_s": {
            "analytic": {t: evaluation["analytic"][t]["mae_s"] for t in terms},
            predictor: {t: evaluation["learned"][t]["mae_s"] for t in terms},
        },
        "coverage_90": evaluation["coverage_90"],
    }


def train_term_set(
    split: TimeSplit, predictor: str = "lightgbm", train_weights: np.ndarray | None = None, **params
) -> TermModelSet:
    """Fit one ``predictor`` per term on ``split.train``, then the calibrators on ``split.calibration``.

    ``train_weights`` (float64 ``(len(split.train),)``, ≥ 0, or None for equal weights) weight the
    training rows of the term models, e.g. the importance weights of
    :func:`~kvcost.models.shift.choice_shift_weights`; the calibrators are not weighted (they
    calibrate the bounds served on chosen requests, which is where coverage is counted).
    ``metadata["importance_weights"]`` records their effective rows and largest weight.

    A term is fitted on the training rows where it was observed (a live service's
    ``/v1/observe`` may report TTFT alone; its other terms are logged as NULL); the
    calibrators use TTFT, which every row has.

    The calibration slice (its rows with a known TTFT: a live gateway logs a non-streamed
    request's TTFT as unknown) is cut in two, in time order: the first half fits the
    isotonic recalibration of the composed TTFT, the second the split-conformal
    P50 / P90 bounds on the recalibrated values. Fitting both on the same rows
    would make the conformal residuals optimistic (isotonic steps chase those very
    rows) and the bounds would under-cover; training rows are never used.

    Isotonic regression fits the conditional *mean*, the L1 term models the
    median; with heavy-tailed TTFT the mean sits above the median and can raise
    the MAE. The recalibration is therefore kept only if it lowers the MAE on the
    second half (recorded in ``metadata["isotonic"]``); on the conversation trace
    it did not (``docs/term-models.md``).

    A term observed in *no* training row (a live engine reports TTFT and its queue
    time, never lookup, transfer, prefill or first-token work apart) is not
    learned from nothing: the prefill term, the largest of them, is fitted on what
    TTFT leaves once the other terms are taken away (their actual values where
    observed, else their analytic ones: a sum, exact when nothing overlaps the
    prefill, as on an engine that fetches no KV), and every other unobserved term
    keeps its analytic predictor. ``metadata["unobserved_terms"]`` says which.
    """
    x_train = feature_matrix(split.train)
    predictors = {}
    unobserved = {}
    for term in TERMS:
        known = _known(split.train, term)
        target = split.train[ACTUAL_COLUMN[term]].to_numpy()
        if not known.any() and term == "prefill":
            known, target = _prefill_residual(split.train, x_train)
            unobserved[term] = "fitted on TTFT less the other terms"
        elif not known.any():
            predictors[term] = make_term_predictor("analytic", term)
            unobserved[term] = "analytic"
            continue
        weights = train_weights[known] if train_weights is not None else None
        predictors[term] = make_term_predictor(predictor, term, **params).fit(x_train[known], target[known], weights)
    model_set = TermModelSet(predictors)
    model_set.metadata["unobserved_terms"] = unobserved
    if train_weights is not None:
        model_set.metadata["importance_weights"] = {
            "effective_rows": effective_rows(train_weights),
            "max_weight": float(np.max(train_weights)) if len(train_weights) else 0.0,
        }
    iso_rows, conformal_rows = _halves(split.calibration[_known(split.calibration, "ttft")])
    isotonic = IsotonicCalibrator().fit(
        model_set.predict(feature_matrix(iso_rows)).ttft_s, iso_rows["actual_ttft_s"].to_numpy()
    )
    raw_conf_s = model_set.predict(feature_matrix(conformal_rows)).ttft_s
    actual_conf_s = conformal_rows["actual_ttft_s"].to_numpy()
    mae_raw_s = float(np.mean(np.abs(raw_conf_s - actual_conf_s)))
    mae_iso_s = float(np.mean(np.abs(isotonic.transform(raw_conf_s) - actual_conf_s)))
    model_set.isotonic = isotonic if mae_iso_s < mae_raw_s else None
    calibrated_s = model_set.isotonic.transform(raw_conf_s) if model_set.isotonic is not None else raw_conf_s
    model_set.conformal = SplitConformal().fit(calibrated_s, actual_conf_s)
    model_set.metadata["isotonic"] = {
        "kept": model_set.isotonic is not None,
        "mae_raw_s": mae_raw_s,
        "mae_isotonic_s": mae_iso_s,
    }
    model_set.metadata.update(
        predictor=predictor,
        params=params,
        rows={"train": len(split.train), "calibration": len(split.calibration), "holdout": len(split.holdout)},
        window_arrival_s={
            "train": [float(split.train["arrival_s"].min()), float(split.train["arrival_s"].max())],
            "holdout": [float(split.holdout["arrival_s"].min()), float(split.holdout["arrival_s"].max())],
        },
    )
    return model_set


def _prefill_residual(frame: pd.DataFrame, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, target)`` for a prefill term observed nowhere: TTFT less the other terms (each its actual value
    where observed, else its analytic value), clipped at 0, on the rows whose TTFT was observed."""
    residual = frame[ACTUAL_COLUMN["ttft"]].to_numpy(dtype=float).copy()
    for other in TERMS:
        if other == "prefill":
            continue
        analytic = make_term_predictor("analytic", other).predict_many(x)
        residual -= np.where(_known(frame, other), frame[ACTUAL_COLUMN[other]].to_numpy(dtype=float), analytic)
    return _known(frame, "ttft"), np.maximum(residual, 0.0)


def _known(frame: pd.DataFrame, term: str) -> np.ndarray:
    """bool ``(n,)``: rows whose actual ``term`` was observed (``/v1/observe`` may give TTFT alone)."""
    return frame[ACTUAL_COLUMN[term]].notna().to_numpy()


def _halves(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    half = len(frame) // 2
    if half < 2:
        raise ValueError(f"calibration slice has {len(frame)} rows, expected at least 4")
    return frame.iloc[:half], frame.iloc[half:]


def evaluate(model_set: TermModelSet, holdout: pd.DataFrame) -> dict:
    """Holdout metrics of ``model_set`` and of the analytic baseline, per term and for TTFT.

    Returns:
        ``{"learned": {term: metrics}, "analytic": {term: metrics}, "coverage_90": float, "rows": n}``
        where terms are TERMS plus ``"ttft"`` (learned TTFT = the recalibrated P50 score). Each
        term's metrics, TTFT's and the coverage count only the rows where that actual is known.
    """
    x = feature_matrix(holdout)
    learned = model_set.predict(x)
    analytic = TermModelSet.analytic().predict(x)
    calibrated = model_set.calibrate(learned)
    actual = {t: holdout[ACTUAL_COLUMN[t]].to_numpy() for t in TERMS_AND_TTFT}
    out: dict = {"learned": {}, "analytic": {}, "rows": len(holdout)}
    for term in TERMS:
        known = _known(holdout, term)
        out["learned"][term] = error_metrics(getattr(learned, f"{term}_s")[known], actual[term][known])
        out["analytic"][term] = error_metrics(getattr(analytic, f"{term}_s")[known], actual[term][known])
    known = _known(holdout, "ttft")  # a non-streamed request's TTFT is unknown (NULL), not 0
    out["learned"]["ttft"] = error_metrics(calibrated.p50_s[known], actual["ttft"][known])
    out["analytic"]["ttft"] = error_metrics(analytic.ttft_s[known], actual["ttft"][known])
    out["coverage_90"] = (
        float(np.mean(actual["ttft"][known] <= calibrated.p90_s[known])) if known.any() else float("nan")
    )
    return out
