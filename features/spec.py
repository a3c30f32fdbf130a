"""The one feature schema of kvcost (docs/architecture.md §3, "One feature schema").

Every feature the cost model, the router log and (later) eviction use is
declared here once: name, dtype, unit and description. A feature row
describes one (request, candidate worker) pair *at decision time*: nothing
known only after the routing decision may enter.

Rows are built by :mod:`kvcost.features.build` as ``float64`` arrays of shape
``(n_candidates, len(FEATURE_SPEC))`` with columns in :data:`FEATURE_NAMES`
order. The DuckDB ``candidates`` table stores them under the same names.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class Feature:
    """One feature column.

    Attributes:
        name: column name; the unit is part of the name (``_s``, ``_tokens`` ...).
        dtype: DuckDB/NumPy dtype name of the stored value (``DOUBLE`` or ``BIGINT``).
        unit: physical unit (``s``, ``tokens``, ``blocks``, ``requests``, ``ratio``, ``code``).
        description: what it measures and where it comes from (request, worker, directory).
    """

    name: str
    dtype: str
    unit: str
    description: str


FEATURE_SPEC: tuple[Feature, ...] = (
    # request
    Feature("input_tokens", "BIGINT", "tokens", "request: prompt length"),
    Feature("request_blocks", "BIGINT", "blocks", "request: full prompt blocks (cacheable)"),
    # directory match for this candidate
    Feature("reusable_tokens", "BIGINT", "tokens", "directory: reusable prefix on the worker"),
    Feature("uncached_tokens", "BIGINT", "tokens", "input_tokens - reusable_tokens"),
    Feature("reusable_tier", "BIGINT", "code", "directory: tier of the match, TIER_CODES"),
    Feature(
        "directory_age_s",
        "DOUBLE",
        "s",
        "directory: time since the worker's last event where it holds part of the prefix, else −1",
    ),
    Feature("load_bytes", "BIGINT", "bytes", "plan: prefix bytes copied CPU → GPU (lower tiers, fetched)"),
    Feature("disk_load_bytes", "BIGINT", "bytes", "plan: part of load_bytes read from local disk first"),
    Feature("transfer_bytes", "BIGINT", "bytes", "plan: prefix bytes fetched over the network"),
    # candidate worker snapshot
    Feature("waiting_requests", "BIGINT", "requests", "worker: requests not finished prefill"),
    Feature("running_requests", "BIGINT", "requests", "worker: requests in decode"),
    Feature("queued_prefill_tokens", "BIGINT", "tokens", "worker: prefill tokens left, queued"),
    Feature("decode_context_tokens", "BIGINT", "tokens", "worker: KV tokens read per decode step"),
    Feature("kv_usage", "DOUBLE", "ratio", "worker: used KV blocks / capacity, in [0, 1]"),
    Feature("idle_cached_blocks", "BIGINT", "blocks", "worker: cached blocks with refcount 0"),
    Feature("recent_step_s", "DOUBLE", "s", "worker: duration of its last finished step (none yet: the nominal one)"),
    Feature("step_remaining_s", "DOUBLE", "s", "worker: time left in the running step"),
    Feature("kv_available_blocks", "BIGINT", "blocks", "worker: capacity minus blocks of running requests"),
    Feature("kv_deficit_blocks", "BIGINT", "blocks", "worker: queued prompt + own new blocks beyond available"),
    Feature("oldest_waiting_s", "DOUBLE", "s", "worker: wait so far of its oldest unadmitted request"),
    Feature("kv_wait_estimate_s", "DOUBLE", "s", "worker: wait for KV beyond the queue (nominal.kv_wait_s)"),
    Feature("recent_step_ratio", "DOUBLE", "ratio", "worker: last step time / profile's time (1 if unknown)"),
    Feature("load_backlog_s", "DOUBLE", "s", "worker: wait for its CPU → GPU link"),
    Feature("transfer_backlog_s", "DOUBLE", "s", "worker: wait for its inbound network link"),
    # nominal times from the GPU type's measured profile (features/nominal.py)
    Feature("nominal_queue_s", "DOUBLE", "s", "profile: time until this request's first chunk"),
    Feature("nominal_lookup_s", "DOUBLE", "s", "profile: prefix lookup and preparation (tier loads)"),
    Feature("nominal_transfer_s", "DOUBLE", "s", "links: network fetch of the prefix, backlog included"),
    Feature("nominal_prefill_s", "DOUBLE", "s", "profile: first chunk start to last chunk end"),
    Feature("nominal_first_token_s", "DOUBLE", "s", "profile: sampling, detokenise, network"),
)

FEATURE_NAMES: tuple[str, ...] = tuple(f.name for f in FEATURE_SPEC)
FEATURE_INDEX: dict[str, int] = {name: i for i, name in enumerate(FEATURE_NAMES)}


def feature_spec_hash(spec: tuple[Feature, ...] = FEATURE_SPEC) -> str:
    """Stable hex SHA-256 (first 16 hex digits) of the spec's names, dtypes and units.

    Descriptions are excluded so that rewording a description does not
    invalidate trained models; renaming, reordering or retyping a feature does.
    """
    payload = [{k: v for k, v in asdict(f).items() if k != "description"} for f in spec]
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
    return digest[:16]


# -- eviction ------------------------------------------------------------------------------
#: Features of one idle cached block (a prefix node) at a moment ``now_s``, for the reuse
#: classifier of ``cost_aware`` eviction (:mod:`kvcost.models.reuse`); built by
#: :func:`kvcost.features.eviction.eviction_features` as float64 ``(n, len(EVICTION_FEATURE_SPEC))``.
#: Hashed separately from FEATURE_SPEC: a reuse model records ``feature_spec_hash(EVICTION_FEATURE_SPEC)``.
EVICTION_FEATURE_SPEC: tuple[Feature, ...] = (
    Feature("depth_blocks", "BIGINT", "blocks", "block: 0-based position in its prefix"),
    Feature("hits", "BIGINT", "hits", "block: reuses since it was stored"),
    Feature("idle_s", "DOUBLE", "s", "block: now - last access (time idle)"),
    Feature("age_s", "DOUBLE", "s", "block: now - time stored"),
    Feature("size_bytes", "DOUBLE", "bytes", "block: KV bytes held"),
    Feature("category", "BIGINT", "code", "request: category code from the caller, 0 = unknown"),
    Feature("request_blocks", "BIGINT", "blocks", "request: full prompt blocks of the last request holding it"),
    Feature("tail_distance_blocks", "BIGINT", "blocks", "request_blocks - 1 - depth_blocks, ≥ 0 (0 = its tail)"),
    Feature("mean_reuse_gap_s", "DOUBLE", "s", "block: (last access - stored) / hits, −1 if never hit"),
    Feature("request_reused_blocks", "BIGINT", "blocks", "request: leading blocks found cached at its admission"),
    Feature("request_reused_share", "DOUBLE", "ratio", "request_reused_blocks / request_blocks, in [0, 1]"),
)

EVICTION_FEATURE_NAMES: tuple[str, ...] = tuple(f.name for f in EVICTION_FEATURE_SPEC)
