"""Build feature rows for (request, candidate worker) pairs at decision time.

The same function serves routing, training and eviction, so a logged row and
a row rebuilt later from the same state are identical (no leakage: only the
request, the snapshots and the directory matches enter, all known before the
decision).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from kvcost.core.hardware import StepTimeModel
from kvcost.core.types import TIER_CODES, blocks_to_allocate
from kvcost.features.nominal import (
    KvWaitInputs,
    NominalCosts,
    kv_wait_batch_s,
    kv_wait_sd_batch_s,
    queue_and_prefill_s,
)
from kvcost.features.spec import FEATURE_NAMES

#: The key of :func:`feature_columns`' one column that is not a feature: the KV-wait estimate's standard
#: deviation, seconds (:func:`~kvcost.features.nominal.kv_wait_sd_batch_s`). The cost-aware policies read it
#: (``PolicyContext.kv_wait_sd_s``); no model does, and :func:`stack_features` leaves it out.
KV_WAIT_SD_COLUMN = "kv_wait_sd_s"

if TYPE_CHECKING:
    from kvcost.core.types import DirectoryMatch, ReusePlan, RouteRequest, WorkerSnapshot


def stack_features(columns: Mapping[str, np.ndarray]) -> np.ndarray:
    """The float64 ``(n, len(FEATURE_NAMES))`` matrix of :func:`feature_columns`, columns in ``FEATURE_NAMES`` order.

    Raises:
        KeyError: a feature of the spec is missing from ``columns``.
    """
    n = len(columns[FEATURE_NAMES[0]])
    matrix = np.empty((n, len(FEATURE_NAMES)), dtype=np.float64)
    for j, name in enumerate(FEATURE_NAMES):
        matrix[:, j] = columns[name]
    return matrix


def feature_columns(
    request: RouteRequest,
    snapshots: Sequence[WorkerSnapshot],
    matches: Sequence[DirectoryMatch],
    reusable_tokens: Sequence[int],
    step_models: Mapping[str, StepTimeModel],
    costs: NominalCosts,
    plans: Sequence[ReusePlan] | None = None,
) -> dict[str, np.ndarray]:
    """Every feature of :data:`~kvcost.features.spec.FEATURE_SPEC` for one request over its candidates, by name.

    Args:
        request: the request being routed.
        snapshots: one per candidate, same order as ``matches`` and ``reusable_tokens``.
        matches: directory match per candidate.
        reusable_tokens: reusable prefix per candidate, tokens (see ``reusable_tokens_for``).
        step_models: nominal step-time model per GPU type name.
        costs: nominal lookup, first-token and link costs.
        plans: per candidate, where the reusable prefix comes from (GPU, lower tiers,
            a transfer); None = all of it is GPU-resident (no tiers, no transfers).

    Returns:
        Feature name → array of shape ``(n_candidates,)`` in the spec's unit (int64 or float64;
        :func:`stack_features` stacks them as float64), every feature in the spec's order, then
        :data:`KV_WAIT_SD_COLUMN`, which is not a feature (the models never see it): the KV-wait
        estimate's standard deviation, seconds (:func:`~kvcost.features.nominal.kv_wait_sd_batch_s`),
        for the router's tie band.

    Raises:
        KeyError: a snapshot's GPU type has no step model.
    """
    n = len(snapshots)
    models = [step_models[s.gpu] for s in snapshots]
    blocks = len(request.block_hashes)
    block_size = request.namespace.block_size_tokens
    reuse = np.asarray(reusable_tokens, dtype=np.int64).reshape(n)
    uncached = request.input_tokens - reuse
    snap = _snapshot_columns(snapshots)
    age_s = np.array([m.age_s for m in matches], dtype=np.float64)
    capacity = snap["kv_capacity_blocks"]
    available = capacity - np.rint(snap["kv_usage"] * capacity)
    new_blocks = np.array([blocks_to_allocate(request.input_tokens, r, block_size) for r in reuse.tolist()])
    deficit = np.where(capacity != 0, np.maximum(0.0, snap["waiting_prompt_blocks"] + new_blocks - available), 0.0)
    nominal = snap["recent_step_nominal_s"]
    recent = _recent_step_s(snapshots, models, snap["recent_step_s"])
    with np.errstate(over="ignore"):  # a tiny nominal step gives inf, as Python's float division does
        ratio = np.divide(recent, nominal, out=np.ones(n), where=nominal > 0)
    block_bytes = np.array([m.model.kv_bytes_per_token * block_size for m in models], dtype=np.int64)
    load_bytes, disk_bytes, transfer_bytes, conversion = _plan_columns(plans, n, block_bytes)
    queued = snap["queued_prefill_tokens"].astype(np.int64)
    per_candidate = (uncached, reuse, deficit, queued, load_bytes, disk_bytes, transfer_bytes, conversion)
    queue_s, prefill_s, kv_wait, lookup_s, transfer_s, kv_wait_sd = _nominal_columns(
        request, snapshots, models, costs, per_candidate
    )
    return {
        "input_tokens": np.full(n, request.input_tokens, dtype=np.int64),
        "request_blocks": np.full(n, blocks, dtype=np.int64),
        "reusable_tokens": reuse,
        "uncached_tokens": uncached,
        "reusable_tier": _tier_codes(matches, plans, reuse),
        "directory_age_s": _directory_age_s(matches, age_s),
        "load_bytes": load_bytes,
        "disk_load_bytes": disk_bytes,
        "transfer_bytes": transfer_bytes,
        "waiting_requests": snap["waiting_requests"],
        "running_requests": snap["running_requests"],
        "queued_prefill_tokens": snap["queued_prefill_tokens"],
        "decode_context_tokens": snap["decode_context_tokens"],
        "kv_usage": snap["kv_usage"],
        "idle_cached_blocks": snap["idle_cached_blocks"],
        "recent_step_s": recent,
        "step_remaining_s": snap["step_remaining_s"],
        "kv_available_blocks": available,
        "kv_deficit_blocks": deficit,
        "oldest_waiting_s": snap["oldest_waiting_s"],
        "kv_wait_estimate_s": kv_wait,
        "recent_step_ratio": ratio,
        "load_backlog_s": snap["load_backlog_s"],
        "transfer_backlog_s": snap["transfer_backlog_s"],
        "nominal_queue_s": queue_s,
        "nominal_lookup_s": lookup_s,
        "nominal_transfer_s": transfer_s,
        "nominal_prefill_s": prefill_s,
        "nominal_first_token_s": np.full(n, costs.first_token_s, dtype=np.float64),
        KV_WAIT_SD_COLUMN: kv_wait_sd,
    }


def _directory_age_s(matches, age_s: np.ndarray) -> np.ndarray:
    """Seconds since the directory last heard from each candidate, where the candidate holds part of the
    request's prefix; −1 where it holds none or was never heard from.

    Why only with a match: the age says how stale the promised reuse may be; with nothing promised
    it says only that the worker stored nothing lately, which an idle or restarted worker shares
    with a dead one. A learned term then read a long age as slow prefill: in the end-to-end test a
    restarted engine, whose directory stayed silent because it was sent nothing, was predicted at
    0.66 s against 0.15 s for its busy peer on prompts neither held, and got none of 80 requests
    (its silence grew with every request it did not get)."""
    matched = np.array([m.reusable_blocks > 0 for m in matches], dtype=bool)
    return np.where(np.isfinite(age_s) & matched, age_s, -1.0)


def _recent_step_s(snapshots, models, measured_s: np.ndarray) -> np.ndarray:
    """The workers' recent step time, seconds: as measured, or, where nothing was measured (0: an
    engine that generated no token since the last scrape, a new process, a replay's first step),
    the nominal decode step of its running batch × the median measured ÷ nominal step of the
    measured workers of its GPU type (1 when none is measured).

    Why: an idle or restarted worker's 0 is a value no busy worker ever shows, so a learned term
    reads it as an unseen regime; in the end-to-end test a restarted engine's 0 made the learned
    prefill term predict 0.15 s against 0.02 s on the busy one, and the idle engine got none of 80
    requests. The nominal step alone was not enough there: the CPU engine's measured steps were
    a third of its profile's (4.4 against 13.8 ms), so the restarted worker again looked slower
    than any measured one and got none of 80 (stop 25). Its peers' ratio carries what the
    profile gets wrong about that GPU type, and holds wherever workers of one type run alike."""
    if np.all(measured_s > 0):
        return measured_s
    nominal = [
        model.step_s(max(1, s.running_requests), 0.0, s.decode_context_tokens)
        for s, model in zip(snapshots, models, strict=True)
    ]
    ratios: dict[str, list[float]] = {}
    for s, m, n in zip(snapshots, measured_s.tolist(), nominal, strict=True):
        if m > 0 and n > 0:
            ratios.setdefault(s.gpu, []).append(m / n)
    fallback = [
        m if m > 0 else n * (float(np.median(ratios[s.gpu])) if s.gpu in ratios else 1.0)
        for s, m, n in zip(snapshots, measured_s.tolist(), nominal, strict=True)
    ]
    return np.array(fallback, dtype=np.float64)


def _nominal_columns(request, snapshots, models, costs: NominalCosts, per_candidate) -> np.ndarray:
    """The profile-based times per candidate, float64 ``(6, n)``: queue, prefill, KV wait, lookup, transfer,
    and the KV wait's standard deviation.

    The nominal formulas (:mod:`kvcost.features.nominal`) take one candidate at a time, except the
    KV wait, whose root finding runs for all candidates at once (:func:`kv_wait_batch_s`); the
    candidate arrays are read as Python numbers first (numpy scalars are slow in a loop).
    """
    blocks = len(request.block_hashes)
    rows, kv_workers = [], []
    for s, model, uncached, reuse, deficit, queued, load, disk, fetched, conversion in zip(
        snapshots, models, *(column.tolist() for column in per_candidate), strict=True
    ):
        queue_s, prefill_s = queue_and_prefill_s(
            model, s.waiting_prefill, s.running_requests, s.decode_context_tokens, s.step_remaining_s, uncached, reuse
        )
        held_blocks = s.kv_usage * s.kv_capacity_blocks if s.kv_capacity_blocks > 0 else None
        kv_workers.append(
            KvWaitInputs(
                model,
                deficit,
                s.running_requests,
                s.decode_context_tokens,
                queued,
                held_blocks,
                s.running_output_tokens,
            )
        )
        lookup_s = costs.lookup_s(blocks) + costs.load_s(load, disk, s.load_backlog_s)
        transfer_s = costs.transfer_s(fetched, s.transfer_backlog_s)
        transfer_s += conversion * costs.network.duration_s(fetched)
        rows.append((queue_s, prefill_s, 0.0, lookup_s, transfer_s, 0.0))
    columns = np.array(rows, dtype=np.float64).reshape(len(rows), 6).T
    law = (request.namespace.block_size_tokens, costs.output_tokens_mean, costs.output_tokens_cv2)
    columns[2] = kv_wait_batch_s(kv_workers, *law)
    columns[5] = kv_wait_sd_batch_s(kv_workers, *law)
    return columns


#: Snapshot attributes read as float64 columns (every count is exact in float64).
_SNAPSHOT_COLUMNS: tuple[str, ...] = (
    "waiting_requests",
    "running_requests",
    "queued_prefill_tokens",
    "decode_context_tokens",
    "kv_usage",
    "idle_cached_blocks",
    "recent_step_s",
    "step_remaining_s",
    "kv_capacity_blocks",
    "waiting_prompt_blocks",
    "oldest_waiting_s",
    "recent_step_nominal_s",
    "load_backlog_s",
    "transfer_backlog_s",
)


_SNAPSHOT_GETTER = operator.attrgetter(*_SNAPSHOT_COLUMNS)


def _snapshot_columns(snapshots: Sequence[WorkerSnapshot]) -> dict[str, np.ndarray]:
    """The snapshot attributes of :data:`_SNAPSHOT_COLUMNS`, one float64 ``(n,)`` array each."""
    table = np.array([_SNAPSHOT_GETTER(s) for s in snapshots], dtype=np.float64).reshape(-1, len(_SNAPSHOT_COLUMNS))
    return {name: table[:, j] for j, name in enumerate(_SNAPSHOT_COLUMNS)}


def _plan_columns(
    plans: Sequence[ReusePlan] | None, n: int, block_bytes: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(load_bytes, disk_load_bytes, transfer_bytes, conversion_factor)`` per candidate (zeros without plans)."""
    if plans is None:
        zeros = np.zeros(n, dtype=np.int64)
        return zeros, zeros, zeros, np.zeros(n)
    loaded = np.array([p.loaded_blocks for p in plans], dtype=np.int64)
    disk = np.array([p.disk_blocks for p in plans], dtype=np.int64)
    fetched = np.array([p.fetch_blocks for p in plans], dtype=np.int64)
    conversion = np.array([p.conversion_factor for p in plans], dtype=np.float64)
    return loaded * block_bytes, disk * block_bytes, fetched * block_bytes, conversion


def _tier_codes(matches, plans: Sequence[ReusePlan] | None, reuse: np.ndarray) -> np.ndarray:
    """Per candidate, :func:`_tier_code` (``(n,)`` int64)."""
    plans = plans if plans is not None else [None] * len(matches)
    codes = [_tier_code(m, p, int(r)) for m, p, r in zip(matches, plans, reuse, strict=True)]
    return np.array(codes, dtype=np.int64)


def _tier_code(match, plan: ReusePlan | None, reuse: int) -> int:
    """Code of the slowest place the reusable prefix comes from (``TIER_CODES``); 0 without reuse."""
    if reuse <= 0:
        return 0
    if plan is None:
        return TIER_CODES[match.tier]
    for tier, blocks in (("remote", plan.fetch_blocks), ("disk", plan.disk_blocks), ("cpu", plan.cpu_blocks)):
        if blocks:
            return TIER_CODES[tier]
    return TIER_CODES["gpu"]
