"""Typed rows of the log's ``requests`` and ``candidates`` tables, built alike by the simulator and the service.

* :class:`RequestRow` — one ``requests`` row (a routed request and what it
  really cost), its predicted and actual terms as vectors in
  :data:`~kvcost.data.store.TERMS_AND_TTFT` order;
  :func:`request_columns` / :func:`request_batch` turn rows into columns named
  by :data:`~kvcost.data.store.SCHEMA` (``pred_*_s``, ``actual_*_s`` from
  :data:`~kvcost.data.store.PRED_COLUMNS` and
  :data:`~kvcost.data.store.ACTUAL_COLUMNS`).
* :class:`CandidateBatch` — the ``candidates`` rows of one or more decisions,
  vectorised (numpy arrays: one per column, the features and the predicted
  terms as matrices whose columns are named by the schema).
* :func:`read_chosen_candidates` — the chosen candidates of earlier runs, the
  scoring service's decisions reloaded after a restart.
* :class:`UnjoinedObservation` — an observation whose decision the service does
  not have (``unjoined_observations``); :func:`read_unjoined_ids` reloads their ids.

Every batch goes to DuckDB through :meth:`kvcost.data.store.LogStore.append`
(directly, or through the service's :class:`~kvcost.data.log_writer.LogWriter`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pandas as pd

from kvcost.core.types import RouteDecision
from kvcost.data.store import ACTUAL_COLUMNS, PRED_COLUMNS, SCHEMA, TERMS_AND_TTFT, LogStore, TableBatch
from kvcost.features.spec import FEATURE_NAMES

_N_TERMS = len(TERMS_AND_TTFT)
_TERMS_TEXT = ", ".join(TERMS_AND_TTFT)


class RequestRow(NamedTuple):
    """One ``requests`` row, ``run_id`` aside (a batch may hold rows of several runs); immutable.

    A named tuple rather than a dataclass: the replay builds one per request
    on its hot path. :func:`request_columns` checks the term vectors.

    Attributes:
        request_id: request id (the trace line, or the client's id).
        arrival_s: arrival, seconds (replay clock or epoch); None = unknown (NULL).
        worker_id: worker that served the request.
        input_tokens: prompt tokens.
        output_tokens: generated tokens; None = not reported.
        predicted_reuse_tokens: reusable prefix the directory promised.
        actual_reuse_tokens: prefix actually reused; None = not reported.
        predicted_s: predicted terms then TTFT, seconds, ``len(TERMS_AND_TTFT)`` values in that order.
        actual_s: actual terms then TTFT, seconds, same order; None or NaN = not measured (NULL).
        tpot_s: mean time per output token after the first, seconds.
        e2e_s: arrival to last token, seconds.
        directory_mismatch_tokens: promised reuse that was gone at admission.
        mismatch_lost_s: nominal prefill time of the mismatch tokens, seconds.
        served_by: prefix source (``local_hit``, ``tier_load``, ``remote_transfer``, ``recompute``).
        directory_reuse_tokens: the prefix the directory held on the chosen worker at decision time,
            without in-flight prefixes, capped as the engine caps a full hit (gateway), or as
            ``predicted_reuse_tokens`` is capped and never above it (replays: the rest of the promise
            was in flight).
        client_request_id: the client's own id of the request (gateway); None in replays.
        outcome: ``ok``, or what ended the request, naming the engine (gateway); None in replays.
        kv_wait_s: replay: the part of the queue term spent at the head of the queue, with prefill
            budget left, waiting for KV memory, seconds; None from the gateway (no engine reports it).
        preemptions: replay: times the request was preempted because KV memory ran out; None from the gateway.
    """

    request_id: int
    arrival_s: float | None
    worker_id: int
    input_tokens: int
    output_tokens: int | None
    predicted_reuse_tokens: int
    actual_reuse_tokens: int | None
    predicted_s: tuple[float, ...]
    actual_s: tuple[float | None, ...]
    tpot_s: float | None = None
    e2e_s: float | None = None
    directory_mismatch_tokens: int | None = None
    mismatch_lost_s: float | None = None
    served_by: str | None = None
    directory_reuse_tokens: int | None = None
    client_request_id: str | None = None
    outcome: str | None = None
    kv_wait_s: float | None = None
    preemptions: int | None = None


#: ``requests`` columns filled from a :class:`RequestRow` field of the same name, in schema order.
_REQUEST_SCALARS: tuple[str, ...] = tuple(
    c.name for c in SCHEMA["requests"] if c.name not in ("run_id", *PRED_COLUMNS, *ACTUAL_COLUMNS)
)
if set(_REQUEST_SCALARS) != set(RequestRow._fields) - {"predicted_s", "actual_s"}:  # schema and row type agree
    raise ImportError(f"RequestRow fields {RequestRow._fields} do not match requests columns {_REQUEST_SCALARS}")
_NUMPY_DTYPES = {"BIGINT": np.int64, "DOUBLE": np.float64}


def request_columns(rows: Sequence[RequestRow]) -> dict[str, np.ndarray | list]:
    """The ``requests`` columns of ``rows`` (without ``run_id``) in schema order.

    BIGINT columns are int64 arrays, DOUBLE ones float64 (None → NaN), unless a
    BIGINT column holds a None: then it stays a list (NULL). VARCHAR columns
    are object arrays.

    Returns:
        One entry per ``requests`` column but ``run_id``, each of ``len(rows)`` values.

    Raises:
        ValueError: a row's ``predicted_s`` or ``actual_s`` does not hold one value per term
            (the message names the field, the request and the terms).
    """
    fields = dict(zip(RequestRow._fields, zip(*rows, strict=True), strict=True)) if rows else {}
    terms = _term_columns("predicted_s", PRED_COLUMNS, rows, fields)
    terms |= _term_columns("actual_s", ACTUAL_COLUMNS, rows, fields)
    columns: dict[str, np.ndarray | list] = {}
    for column in SCHEMA["requests"][1:]:
        if column.name in terms:
            columns[column.name] = terms[column.name]
            continue
        values = fields.get(column.name, ())
        dtype = _NUMPY_DTYPES.get(column.sql_type, object)
        nullable_int = dtype is np.int64 and None in values
        columns[column.name] = list(values) if nullable_int else np.array(values, dtype=dtype)
    return columns


def _term_columns(field: str, names: tuple[str, ...], rows: Sequence[RequestRow], fields: dict) -> dict:
    """One float64 column per term name from the rows' ``field`` vectors (None → NaN)."""
    vectors = fields.get(field, ())
    try:
        matrix = np.array(vectors, dtype=np.float64).reshape(len(vectors), _N_TERMS)
    except ValueError:  # ragged, or every vector one term short or long
        bad = next(i for i, v in enumerate(vectors) if len(v) != _N_TERMS)
        raise ValueError(
            f"RequestRow.{field} of request_id {rows[bad].request_id} has {len(vectors[bad])} values, "
            f"expected {_N_TERMS} ({_TERMS_TEXT})"
        ) from None
    return {name: matrix[:, j] for j, name in enumerate(names)}


def requests_frame(rows: Sequence[RequestRow]) -> pd.DataFrame:
    """``rows`` as a DataFrame of the ``requests`` columns without ``run_id`` (what a replay reports)."""
    return pd.DataFrame(request_columns(rows))


def request_batch(run_id: str | Sequence[str], rows: Sequence[RequestRow]) -> TableBatch:
    """``rows`` as a ``requests`` batch; ``run_id``: one for every row, or one per row.

    Raises:
        ValueError: as many run ids as rows are not given (names ``run_id``).
    """
    run_ids = [run_id] * len(rows) if isinstance(run_id, str) else list(run_id)
    return TableBatch("requests", {"run_id": run_ids, **request_columns(rows)})


class UnjoinedObservation(NamedTuple):
    """One ``unjoined_observations`` row, ``run_id`` aside: an observation whose decision the service does not
    have (lost in a crash before its commit, or older than the decisions kept); recorded, never refused.

    Attributes:
        request_id: the client's request id.
        received_s: when the service received it, epoch seconds.
        actual_s: actual terms then TTFT, seconds, ``len(TERMS_AND_TTFT)`` values; None = not measured (NULL).
        output_tokens, actual_reuse_tokens, tpot_s, e2e_s: as in :class:`RequestRow`; None = not reported.
    """

    request_id: int
    received_s: float
    actual_s: tuple[float | None, ...]
    output_tokens: int | None = None
    actual_reuse_tokens: int | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def batch(self, run_id: str) -> TableBatch:
        """This row as an ``unjoined_observations`` batch of the serve run ``run_id``.

        Raises:
            ValueError: ``actual_s`` does not hold one value per term (names the field).
        """
        if len(self.actual_s) != _N_TERMS:
            raise ValueError(f"actual_s has {len(self.actual_s)} values, expected {_N_TERMS} ({_TERMS_TEXT})")
        columns: dict[str, list] = {"run_id": [run_id], "request_id": [self.request_id]}
        columns["received_s"] = [self.received_s]
        columns |= {name: [value] for name, value in zip(ACTUAL_COLUMNS, self.actual_s, strict=True)}
        columns |= {name: [getattr(self, name)] for name in self._fields[3:]}  # the schema's last columns
        return TableBatch("unjoined_observations", columns)


def read_unjoined_ids(store: LogStore, limit: int) -> list[int]:
    """The request ids of the newest ``limit`` unjoined observations, oldest first."""
    rows = store.connection.execute(
        "SELECT request_id FROM unjoined_observations ORDER BY received_s DESC, rowid DESC LIMIT ?", [limit]
    ).fetchall()
    return [request_id for (request_id,) in reversed(rows)]


@dataclass(frozen=True, slots=True)
class CandidateBatch:
    """``candidates`` rows (one per request × candidate worker), ``run_id`` aside; numpy arrays of ``n`` rows.

    Attributes:
        request_id: int64 ``(n,)``.
        worker_id: int64 ``(n,)``, the candidate.
        chosen: bool ``(n,)``, whether the router chose the candidate.
        features: float64 ``(n, len(FEATURE_NAMES))``, columns in :data:`~kvcost.features.spec.FEATURE_SPEC` order.
        predicted_s: float64 ``(n, len(TERMS_AND_TTFT))``, predicted terms then TTFT, seconds.

    Raises:
        ValueError: an array of another length or width (the message names the field).
    """

    request_id: np.ndarray
    worker_id: np.ndarray
    chosen: np.ndarray
    features: np.ndarray
    predicted_s: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.request_id)
        for name in ("worker_id", "chosen", "features", "predicted_s"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"CandidateBatch.{name} has {len(getattr(self, name))} rows, expected {n}")
        for name, width, what in (
            ("features", len(FEATURE_NAMES), "features"),
            ("predicted_s", _N_TERMS, f"terms ({_TERMS_TEXT})"),
        ):
            shape = getattr(self, name).shape
            if len(shape) != 2 or shape[1] != width:
                raise ValueError(f"CandidateBatch.{name} has shape {shape}, expected ({n}, {width}): {what}")

    @classmethod
    def of_decision(cls, decision: RouteDecision, predicted_s: np.ndarray | None = None) -> CandidateBatch:
        """The rows of one routing decision; ``predicted_s``: ``decision.predictions.as_matrix()`` if given."""
        n = len(decision.worker_ids)
        return cls(
            request_id=np.full(n, decision.request_id, dtype=np.int64),
            worker_id=np.asarray(decision.worker_ids, dtype=np.int64),
            chosen=np.arange(n) == decision.chosen_index,
            features=decision.features,
            predicted_s=decision.predictions.as_matrix() if predicted_s is None else predicted_s,
        )

    def columns(self) -> dict[str, np.ndarray]:
        """The ``candidates`` columns (without ``run_id``) in schema order; features as float64 (the log rounds)."""
        columns = {"request_id": self.request_id, "worker_id": self.worker_id, "chosen": self.chosen}
        columns |= {name: self.features[:, j] for j, name in enumerate(FEATURE_NAMES)}
        return columns | {name: self.predicted_s[:, j] for j, name in enumerate(PRED_COLUMNS)}

    def frame(self) -> pd.DataFrame:
        """The rows as a DataFrame of :meth:`columns` (what a replay reports)."""
        return pd.DataFrame(self.columns())

    def batch(self, run_id: str) -> TableBatch:
        """The rows as a ``candidates`` batch, all of ``run_id``."""
        return TableBatch("candidates", {"run_id": [run_id] * len(self.request_id), **self.columns()})


class CandidateLog:
    """The candidates of many decisions: :meth:`add` keeps references (cheap, per decision), :meth:`batch` stacks them.

    The replay adds every routing decision and builds one :class:`CandidateBatch` at the end.
    """

    def __init__(self) -> None:
        self._request_ids: list[int] = []
        self._worker_ids: list[tuple[int, ...]] = []
        self._chosen: list[int] = []
        self._features: list[np.ndarray] = []
        self._predicted: list[np.ndarray] = []

    def add(self, decision: RouteDecision, predicted_s: np.ndarray) -> None:
        """Keep ``decision``'s candidates; ``predicted_s``: its ``predictions.as_matrix()``, ``(n_candidates, 6)``."""
        self._request_ids.append(decision.request_id)
        self._worker_ids.append(decision.worker_ids)
        self._chosen.append(decision.chosen_index)
        self._features.append(decision.features)
        self._predicted.append(predicted_s)

    def batch(self) -> CandidateBatch:
        """Every kept candidate, decisions in the order added.

        Raises:
            ValueError: as :class:`CandidateBatch` (a decision whose arrays disagree in length or width).
        """
        counts = np.fromiter(map(len, self._worker_ids), np.int64, len(self._worker_ids))
        total = int(counts.sum())
        chosen = np.zeros(total, dtype=bool)
        chosen[np.cumsum(counts) - counts + np.asarray(self._chosen, dtype=np.int64)] = True
        empty = not self._features
        return CandidateBatch(
            request_id=np.repeat(np.asarray(self._request_ids, dtype=np.int64), counts),
            worker_id=np.fromiter(itertools.chain.from_iterable(self._worker_ids), np.int64, total),
            chosen=chosen,
            features=np.empty((0, len(FEATURE_NAMES))) if empty else np.vstack(self._features),
            predicted_s=np.empty((0, _N_TERMS)) if empty else np.vstack(self._predicted),
        )


@dataclass(frozen=True, slots=True)
class ChosenCandidate:
    """A logged decision: the chosen candidate's row of ``candidates``, and whether ``requests`` has its outcome.

    Attributes:
        run_id: run of the decision.
        request_id: request routed.
        worker_id: chosen worker.
        input_tokens: prompt tokens.
        reusable_tokens: reusable prefix the directory promised on the chosen worker.
        predicted_s: predicted terms then TTFT, seconds (:data:`TERMS_AND_TTFT` order).
        observed: a ``requests`` row of the same run and request exists.
    """

    run_id: str
    request_id: int
    worker_id: int
    input_tokens: int
    reusable_tokens: int
    predicted_s: tuple[float, ...]
    observed: bool


def read_chosen_candidates(store: LogStore, configuration: str, limit: int) -> list[ChosenCandidate]:
    """The newest ``limit`` chosen candidates of the runs of ``configuration``, oldest first.

    Newest means latest run start, then latest row within a run; the result is
    in the reverse order (oldest first), the order in which to replay them.
    """
    pred_cols = ", ".join(f"c.{name}" for name in PRED_COLUMNS)
    rows = store.connection.execute(
        f"""
        SELECT c.run_id, c.request_id, c.worker_id, c.input_tokens, c.reusable_tokens, {pred_cols},
               q.request_id IS NOT NULL AS observed
        FROM candidates c
        JOIN runs r ON r.run_id = c.run_id AND r.configuration = ?
        LEFT JOIN (SELECT DISTINCT run_id, request_id FROM requests) q
               ON q.run_id = c.run_id AND q.request_id = c.request_id
        WHERE c.chosen
        ORDER BY r.started_at DESC, c.rowid DESC
        LIMIT ?
        """,
        [configuration, limit],
    ).fetchall()
    return [
        ChosenCandidate(run_id, request_id, worker_id, input_tokens, reuse, tuple(pred), bool(observed))
        for run_id, request_id, worker_id, input_tokens, reuse, *pred, observed in reversed(rows)
    ]
