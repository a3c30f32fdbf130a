"""Build feature rows for (request, candidate worker) pairs at decision time.

The same function serves routing, training and eviction, so a logged row and
a row rebuilt later from the same state are identical (no leakage: only the
request, the snapshots and the directory matches enter, all known before the
decision).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from kvcost.core.hardware import StepTimeModel
from kvcost.core.types import TIER_CODES
from kvcost.features.nominal import NominalCosts, kv_wait_s, queue_and_prefill_s
from kvcost.features.spec import FEATURE_NAMES

if TYPE_CHECKING:
    from kvcost.core.types import DirectoryMatch, ReusePlan, RouteRequest, WorkerSnapshot


def build_features(
    request: RouteRequest,
    snapshots: Sequence[WorkerSnapshot],
    matches: Sequence[DirectoryMatch],
    reusable_tokens: Sequence[int],
    step_models: Mapping[str, StepTimeModel],
    costs: NominalCosts,
    plans: Sequence[ReusePlan] | None = None,
) -> np.ndarray:
    """Feature matrix for one request over its candidates.

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
        float64 array of shape ``(n_candidates, len(FEATURE_SPEC))``, columns in
        ``FEATURE_NAMES`` order.

    Raises:
        KeyError: a snapshot's GPU type has no step model.
    """
    plans = plans if plans is not None else [None] * len(snapshots)
    rows = [
        _row(request, snap, match, int(reuse), step_models[snap.gpu], costs, plan)
        for snap, match, reuse, plan in zip(snapshots, matches, reusable_tokens, plans, strict=True)
    ]
    return np.asarray(rows, dtype=np.float64).reshape(len(rows), len(FEATURE_NAMES))


def _plan_bytes(plan: ReusePlan | None, block_bytes: int) -> tuple[int, int, int]:
    """``(load_bytes, disk_load_bytes, transfer_bytes)`` of a plan (zeros without one)."""
    if plan is None:
        return 0, 0, 0
    return plan.loaded_blocks * block_bytes, plan.disk_blocks * block_bytes, plan.fetch_blocks * block_bytes


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


def _row(request, snap, match, reuse: int, step_model: StepTimeModel, costs: NominalCosts, plan) -> list[float]:
    uncached = request.input_tokens - reuse
    blocks = len(request.block_hashes)
    queue_s, prefill_s = queue_and_prefill_s(
        step_model,
        snap.waiting_prefill,
        snap.running_requests,
        snap.decode_context_tokens,
        snap.step_remaining_s,
        uncached,
        reuse,
    )
    age_s = match.age_s if np.isfinite(match.age_s) else -1.0
    available = snap.kv_capacity_blocks - round(snap.kv_usage * snap.kv_capacity_blocks)
    deficit = max(0, snap.waiting_prompt_blocks + blocks - available) if snap.kv_capacity_blocks else 0
    ratio = snap.recent_step_s / snap.recent_step_nominal_s if snap.recent_step_nominal_s > 0 else 1.0
    block_size = request.namespace.block_size_tokens
    kv_wait = kv_wait_s(
        deficit, snap.decode_context_tokens, block_size, snap.recent_step_s, costs.expected_decode_tokens
    )
    block_bytes = step_model.model.kv_bytes_per_token * block_size
    load_bytes, disk_bytes, transfer_bytes = _plan_bytes(plan, block_bytes)
    conversion = plan.conversion_factor if plan is not None else 0.0
    lookup_s = costs.lookup_s(blocks) + costs.load_s(load_bytes, disk_bytes, snap.load_backlog_s)
    transfer_s = costs.transfer_s(transfer_bytes, snap.transfer_backlog_s)
    transfer_s += conversion * costs.network.duration_s(transfer_bytes)
    return [
        request.input_tokens,
        blocks,
        reuse,
        uncached,
        _tier_code(match, plan, reuse),
        age_s,
        load_bytes,
        disk_bytes,
        transfer_bytes,
        snap.waiting_requests,
        snap.running_requests,
        snap.queued_prefill_tokens,
        snap.decode_context_tokens,
        snap.kv_usage,
        snap.idle_cached_blocks,
        snap.recent_step_s,
        snap.step_remaining_s,
        available,
        deficit,
        snap.oldest_waiting_s,
        kv_wait,
        ratio,
        snap.load_backlog_s,
        snap.transfer_backlog_s,
        queue_s,
        lookup_s,
        transfer_s,
        prefill_s,
        costs.first_token_s,
    ]
