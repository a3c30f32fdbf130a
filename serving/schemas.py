"""Wire format of the scoring API: pydantic models, apart from the router's dataclasses.

Request models carry every limit of the API, so that bad input is refused
with a 422 whose ``loc`` names the field, before any work is done:

* at most :data:`MAX_CANDIDATES` candidates (256) and :data:`MAX_TOKENS`
  tokens (1,048,576) per request;
* every number finite and non-negative, with an upper bound
  (:data:`MAX_SECONDS` for durations, :data:`MAX_COUNT` for counts), so that
  no admissible input can overflow the cost model;
* integers strict (``1.0``, ``"1"`` and ``true`` are not integers); unknown
  fields are errors (a typo is not silently ignored).

Response models say in their names what they carry: times in seconds
(``_s``), sizes in tokens or blocks. A value that can be unknown is ``null``
(never NaN, which JSON cannot carry).
"""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, field_validator, model_validator

from kvcost.core.hardware import GPUS
from kvcost.routing.compatibility import LAYOUT_PATTERN, parse_layout

#: Candidates per request (the issue's limit).
MAX_CANDIDATES = 256
#: Tokens per request: ``input_tokens``, ``len(token_ids)``, ``len(block_hashes)``.
MAX_TOKENS = 1_048_576
#: Largest KV block size accepted, tokens (vLLM uses 16–256, Mooncake traces 512).
MAX_BLOCK_SIZE_TOKENS = 65_536
#: Entries of a snapshot's ``waiting_prefill`` (requests queued on one worker).
MAX_WAITING_REQUESTS = 16_384
#: Entries of a snapshot's ``running_output_tokens`` (requests decoding on one worker; vLLM's
#: ``max_num_seqs`` is 256–1,024 by default).
MAX_RUNNING_REQUESTS = 16_384
#: Upper bound of durations, seconds (11.6 days): anything larger is a unit error.
MAX_SECONDS = 1e6
#: Upper bound of wall-clock instants (epoch seconds, year 33658): anything larger is a unit error.
MAX_EPOCH_S = 1e12
#: Upper bound of counts (requests, blocks, tokens summed over a worker).
MAX_COUNT = 2**40
#: Ids are DuckDB BIGINT.
MAX_ID = 2**63 - 1
#: Length of namespace strings.
MAX_NAME_CHARS = 256


def _integral(value: Any) -> Any:
    """A float with no fractional part (``59.0``) as the integer it is: JSON Schema counts it as an
    integer, so the published ``"type": "integer"`` admits it; anything else goes to the strict check."""
    if type(value) is float and value.is_integer():
        return int(value)
    return value


# Numbers are strict: a JSON string or boolean where a number belongs is refused (422 naming the field),
# never coerced (``"0.25"`` or ``true`` stored as seconds); an integer is a valid number of seconds, and a
# float with no fractional part a valid integer.
def strict_integer(ge: int, le: int) -> Any:
    """An integer in ``[ge, le]``: strict, but ``59.0`` is 59. The bounds sit on the inner int, so that the
    published schema states them as ``minimum`` / ``maximum`` (on the validator they would not be)."""
    return Annotated[Annotated[int, Strict(), Field(ge=ge, le=le)], BeforeValidator(_integral)]


Id = strict_integer(0, MAX_ID)
Count = strict_integer(0, MAX_COUNT)
Tokens = strict_integer(0, MAX_TOKENS)


def _integral_items(values: Any) -> Any:
    """:func:`_integral` over a list in one pass, only when it holds a float: a 1M-token list is then
    checked item by item in pydantic's core (about 4× faster than a Python validator per item)."""
    if type(values) is list and float in set(map(type, values)):
        return [_integral(v) for v in values]
    return values


TokenIds = Annotated[list[Annotated[int, Strict(), Field(ge=0, lt=2**32)]], BeforeValidator(_integral_items)]
BlockHashes = Annotated[list[Annotated[int, Strict(), Field(ge=0, lt=2**64)]], BeforeValidator(_integral_items)]
Seconds = Annotated[float, Strict(), Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)]
Ratio = Annotated[float, Strict(), Field(ge=0, le=1, allow_inf_nan=False)]
Name = Annotated[str, Field(max_length=MAX_NAME_CHARS)]

_IN = ConfigDict(extra="forbid")


class NamespaceIn(BaseModel):
    """KV compatibility key (docs/architecture.md §2): a prefix is reusable only within one namespace."""

    model_config = _IN

    model: Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)] = Field(
        description="served model name, e.g. meta-llama/Meta-Llama-3-8B"
    )
    revision: Name = Field("main", description="model weights revision")
    adapter: Name = Field("", description="LoRA adapter name, empty for none")
    block_size_tokens: strict_integer(1, MAX_BLOCK_SIZE_TOKENS) | None = Field(
        None, description="KV block size in tokens; null = the service's --block-size-tokens"
    )
    kv_layout: Name = Field(
        "bf16-tp1",
        description="KV dtype and tensor-parallel split, '<dtype>-tp<N>'",
        json_schema_extra={"pattern": LAYOUT_PATTERN},
    )
    cache_salt: Name = Field("", description="per-tenant cache salt, empty for none")

    @field_validator("kv_layout")
    @classmethod
    def _layout(cls, value: str) -> str:
        parse_layout(value)  # ValueError names the field, the value and the form
        return value


class RequestIn(BaseModel):
    """One request to score or route: its prompt as token ids OR as full-block hashes, and its namespace."""

    # the OpenAPI schema states the two prompt forms, so that clients and fuzzers see them
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "oneOf": [  # a form "given" is present and not null, as the validator reads it
                {
                    "required": ["token_ids"],
                    "properties": {"token_ids": {"type": "array"}},
                    "not": {"required": ["block_hashes"], "properties": {"block_hashes": {"type": "array"}}},
                },
                {
                    "required": ["block_hashes", "input_tokens"],
                    "properties": {
                        "block_hashes": {"type": "array"},
                        "input_tokens": {"type": "integer", "minimum": 1, "maximum": MAX_TOKENS},
                    },
                    "not": {"required": ["token_ids"], "properties": {"token_ids": {"type": "array"}}},
                },
            ]
        },
    )

    request_id: Id = Field(description="caller's id; the key of /v1/observe")
    namespace: NamespaceIn
    input_tokens: strict_integer(1, MAX_TOKENS) | None = Field(
        None, description="prompt length; required with block_hashes, = len(token_ids) with token_ids"
    )
    token_ids: Annotated[TokenIds, Field(min_length=1, max_length=MAX_TOKENS)] | None = Field(
        None, description="prompt token ids; the service hashes the full blocks"
    )
    block_hashes: Annotated[BlockHashes, Field(max_length=MAX_TOKENS)] | None = Field(
        None, description="chained hashes of the prompt's full blocks, prompt order"
    )
    arrival_s: Annotated[float, Strict(), Field(ge=0, le=MAX_EPOCH_S, allow_inf_nan=False)] | None = Field(
        None, description="arrival time, epoch seconds; null = when the service received it"
    )

    @model_validator(mode="after")
    def _one_prompt_form(self) -> RequestIn:
        if (self.token_ids is None) == (self.block_hashes is None):
            raise ValueError("give exactly one of token_ids or block_hashes")
        if self.token_ids is not None and self.input_tokens not in (None, len(self.token_ids)):
            raise ValueError(f"input_tokens = {self.input_tokens} but token_ids has {len(self.token_ids)} tokens")
        if self.block_hashes is not None and self.input_tokens is None:
            raise ValueError("input_tokens is required with block_hashes")
        return self


class ErrorItem(BaseModel):
    """One invalid field: where (``loc``, starting with ``body``, ``path`` …), what is wrong, its kind."""

    loc: list[str | int]
    msg: str
    type: str


class ErrorOut(BaseModel):
    """Every error the service answers (401, 409, 413, 422, 503): ``detail`` is the list of invalid fields
    for a 422, else one sentence; ``message`` (422) is the first field's path and message on one line."""

    detail: list[ErrorItem] | str
    message: str | None = None


class SnapshotIn(BaseModel):
    """Load of one worker (fields of :class:`kvcost.core.types.WorkerSnapshot`, same units)."""

    model_config = _IN

    gpu: Name | None = Field(
        None,
        description="GPU type (a100, h100); null = the service's --gpu",
        json_schema_extra=lambda schema: schema["anyOf"][0].update(enum=sorted(GPUS)),
    )
    waiting_prefill: Annotated[list[tuple[Tokens, Count]], Field(max_length=MAX_WAITING_REQUESTS)] = Field(
        default_factory=list,
        description="per request not done with prefill, FCFS: [remaining_prefill_tokens, context_tokens]",
    )
    running_requests: Count = 0
    decode_context_tokens: Count = Field(0, description="sum of the decoding requests' KV lengths")
    kv_usage: Ratio = Field(0.0, description="KV blocks used by running requests / capacity")
    idle_cached_blocks: Count = 0
    recent_step_s: Seconds = 0.0
    step_remaining_s: Seconds = 0.0
    kv_capacity_blocks: Count = Field(0, description="0 = unknown")
    waiting_prompt_blocks: Count = Field(
        0,
        description="KV blocks admitting the waiting requests takes from the free and idle cached blocks: "
        "their new blocks plus the idle cached blocks of their reused prefixes, each once",
    )
    oldest_waiting_s: Seconds = 0.0
    recent_step_nominal_s: Seconds = Field(0.0, description="0 = unknown")
    running_output_tokens: Annotated[list[Count], Field(max_length=MAX_RUNNING_REQUESTS)] = Field(
        default_factory=list,
        description="output tokens each decoding request has produced so far (any order); empty = unknown. "
        "The KV-wait estimate uses it only with one entry per running request",
    )
    namespace: NamespaceIn | None = Field(
        None,
        description="what the worker serves (model, revision, adapter, block size, KV layout); null = anything. "
        "Candidates that cannot serve the request's namespace are left out",
    )


class CandidateIn(BaseModel):
    """A candidate worker: its id and, optionally, its snapshot (else the last one pushed)."""

    model_config = _IN

    worker_id: Id
    snapshot: SnapshotIn | None = None


class ScoreRequestIn(BaseModel):
    """Body of ``POST /v1/score`` and ``POST /v1/route``."""

    model_config = _IN

    request: RequestIn
    candidates: Annotated[list[CandidateIn], Field(min_length=1, max_length=MAX_CANDIDATES)]

    @field_validator("candidates")
    @classmethod
    def _distinct_workers(cls, candidates: list[CandidateIn]) -> list[CandidateIn]:
        counts = Counter(c.worker_id for c in candidates)
        duplicates = sorted(w for w, n in counts.items() if n > 1)
        if duplicates:
            raise ValueError(f"worker_id {duplicates} listed more than once")
        return candidates


class ObservationIn(BaseModel):
    """Body of ``POST /v1/observe``: the actual times of a routed request (seconds)."""

    model_config = _IN

    request_id: Id
    ttft_s: Seconds = Field(description="actual time to first token")
    queue_s: Seconds | None = None
    lookup_s: Seconds | None = None
    transfer_s: Seconds | None = None
    prefill_s: Seconds | None = None
    first_token_s: Seconds | None = None
    output_tokens: Count | None = Field(None, description="generated tokens (with e2e_s: the output length)")
    actual_reuse_tokens: Tokens | None = Field(None, description="prefix actually reused at admission")
    tpot_s: Seconds | None = None
    e2e_s: Seconds | None = Field(None, description="arrival to the last token: the request finished")


class TermsOut(BaseModel):
    """Predicted TTFT terms of one candidate, seconds."""

    queue_s: float
    lookup_s: float
    transfer_s: float
    prefill_s: float
    first_token_s: float


class CandidateScore(BaseModel):
    """One candidate's breakdown. ``score_s`` is what the cost-aware policies rank by (lower is better): the
    composed TTFT of the terms (``ttft_s``); ``p50_s`` / ``p90_s`` are its calibration, for reporting."""

    worker_id: int
    terms: TermsOut
    ttft_s: float = Field(description="terms composed on the critical path")
    p50_s: float = Field(description="calibrated TTFT (= ttft_s with the analytic model)")
    p90_s: float | None = Field(description="conformal 90 % upper bound; null without calibration")
    score_s: float
    reusable_tokens: int
    expected_reuse_tokens: int = Field(
        description="reusable_tokens less the part expected to be evicted before the request is admitted "
        "(where the worker's memory is short); the work the request adds to the queue is counted net of it"
    )
    reusable_blocks: int
    tier: str = Field(description="tier of the deepest matched block: none, gpu, cpu, disk, remote")
    directory_age_s: float | None = Field(description="time since the worker's last KV event; null if never")
    directory_stale: bool = Field(
        description="the worker's KV event stream lost batches that could not be replayed (its reusable "
        "prefix may be wrong until the engine restarts or clears its cache), or its engine does not answer "
        "(nothing of it is matched until it answers; a new process starts empty)"
    )
    directory_mode: Literal["exact", "approximate"] = Field(
        description="exact: the worker's KV events feed the directory; approximate: prefixes routed to it "
        "count as cached there for routed_ttl_s (no --kv-events for it)"
    )
    snapshot: Literal["inline", "pushed", "gateway"] = Field(
        description="inline: in the request; pushed: POST /v1/workers/W/snapshot or a scrape; gateway: what "
        "the gateway sent the worker, corrected by its last scrape"
    )
    snapshot_age_s: float = Field(description="0 for an inline snapshot")


class ScoreResponse(BaseModel):
    """Per-candidate scores, candidates in request order; no routing side effects."""

    request_id: int
    model: str = Field(description="cost model used: 'analytic' or 'champion vN'")
    learned: bool
    request_blocks: int = Field(description="full blocks of the prompt")
    profile: str = Field(
        description="the model profile the step times come from: the service's --model when the request names "
        "the model the fleet serves (--served-model-name, else --model), else 'fallback:<--model>' (the "
        "request's model has no profile of its own; kvcost_profile_fallbacks_total counts it)"
    )
    namespace_unverified: bool = Field(
        description="no scored candidate's snapshot declares the namespace it serves: the request's model, "
        "revision, adapter and block size were checked against none (every worker is assumed to serve it)"
    )
    candidates: list[CandidateScore]


class RouteResponse(ScoreResponse):
    """The chosen worker, its reason, and every candidate's breakdown (recorded for /v1/observe)."""

    worker_id: int
    chosen_index: int
    policy: str
    reason: str
    run_id: str = Field(description="log run the decision is recorded under")


class ObservationResponse(BaseModel):
    """Outcome of an observation, durable when returned: ``recorded`` (joined to its decision), ``unjoined``
    (recorded without a decision: none is known for the id, e.g. it was lost in a crash before its commit)
    or ``duplicate`` (already recorded)."""

    request_id: int
    status: Literal["recorded", "unjoined", "duplicate"]
    run_id: str = Field(description="the decision's run; for an unjoined observation, the run that recorded it")
    worker_id: int | None = Field(description="the chosen worker; null for an unjoined observation")


class SnapshotAck(BaseModel):
    """A stored snapshot."""

    worker_id: int
    received_at_s: float = Field(description="epoch seconds")


class ModelStatusOut(BaseModel):
    """The cost model the service scores with."""

    kind: Literal["learned", "analytic"]
    source: str = Field(description="'champion', or 'analytic' (fallback or by configuration)")
    version: str | None
    status: Literal["ready", "degraded", "loading"]
    reason: str
    loaded_at_s: float | None
    feature_spec_hash: str
    metadata: dict[str, Any]


class ModelsResponse(BaseModel):
    """``GET /v1/cost-models``: the serving model and the registry's versions (champion, challenger, others)."""

    serving: ModelStatusOut
    feature_spec_hash: str = Field(description="feature spec of this kvcost")
    registry_uri: str | None
    registry_error: str | None
    versions: list[dict[str, Any]]


class HealthResponse(BaseModel):
    """Liveness."""

    status: Literal["ok"]


class ReadinessResponse(BaseModel):
    """Readiness: ``ready``; ``degraded`` (200: scoring works on the analytic fallback); else 503."""

    status: Literal["ready", "degraded", "starting", "unavailable"]
    reason: str
    model: str


# --------------------------------------------------------------------------- eviction ranking

#: Nodes per ``/v1/evict/rank`` call (a worker's whole idle cache at 512-token blocks and more).
MAX_EVICT_NODES = 100_000
#: Largest block accepted, bytes (1 TiB: anything larger is a unit error).
MAX_BLOCK_BYTES = 2.0**40


class EvictNodeIn(BaseModel):
    """One idle cached prefix node (a KV block with reference count 0) and its statistics."""

    model_config = _IN

    node_id: Id = Field(description="caller's id of the node (e.g. its block hash, below 2^63)")
    parent_id: Id | None = Field(None, description="node_id of its parent if that is also in this list, else null")
    depth_blocks: Count = Field(description="0-based position of the block in its prefix")
    hits: Count = Field(0, description="reuses since the block was stored")
    last_access_s: Annotated[float, Strict(), Field(ge=0, le=MAX_EPOCH_S, allow_inf_nan=False)] = Field(
        description="last reference or release, seconds on the caller's clock"
    )
    created_s: Annotated[float, Strict(), Field(ge=0, le=MAX_EPOCH_S, allow_inf_nan=False)] = Field(
        description="time stored, seconds on the caller's clock, ≤ last_access_s"
    )
    size_bytes: Annotated[float, Strict(), Field(ge=1, le=MAX_BLOCK_BYTES, allow_inf_nan=False)] = Field(
        description="KV bytes held"
    )
    prefill_saved_s: Seconds = Field(description="prefill seconds a hit on this block saves")
    restore_s: Seconds | None = Field(None, description="seconds to restore it if demoted; null = drop only")
    flops_saved: Annotated[float, Strict(), Field(ge=0, le=1e30, allow_inf_nan=False)] | None = Field(
        None, description="FLOPs a hit saves (flop_aware); null = prefill_saved_s as the proxy"
    )
    category: Count = Field(0, description="request category code, 0 = unknown")
    request_blocks: Count | None = Field(
        None, description="full blocks of the last request holding it; null = depth + 1"
    )
    request_reused_blocks: Count = Field(
        0, description="leading blocks of that request found cached at its admission (cost_aware's reuse model)"
    )


class EvictRankIn(BaseModel):
    """``POST /v1/evict/rank``: rank idle prefix nodes for eviction under a registered policy."""

    model_config = _IN

    policy: Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)] = Field(
        description="eviction policy: lru, lfu, gdsf, lhd, flop_aware, cost_aware",
        json_schema_extra=lambda schema: schema.update(enum=_eviction_policies()),
    )
    now_s: Annotated[float, Strict(), Field(ge=0, le=MAX_EPOCH_S, allow_inf_nan=False)] = Field(
        description="ranking time, seconds on the nodes' clock"
    )
    horizon_s: Annotated[float, Strict(), Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)] = Field(
        300.0,
        description="cost_aware's reuse horizon H of its recency prior exp(−idle/H); a service started with "
        "--reuse-model-dir uses that model's H instead",
    )
    nodes: Annotated[list[EvictNodeIn], Field(max_length=MAX_EVICT_NODES)]

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        if value not in _eviction_policies():
            if value in _registered_policies():  # registered but not deployable: it reads the future
                problem = f"{value!r} is an offline reference that reads a trace's future (replays only)"
            else:
                problem = f"unknown eviction policy {value!r}"
            raise ValueError(f"{problem}, expected one of {', '.join(_eviction_policies())}")
        return value


def _eviction_policies() -> list[str]:
    """The deployable eviction policies' names (imported when first needed: the registry loads the models);
    the offline ``clairvoyant`` reference is not one."""
    from kvcost.eviction import deployable_policies

    return deployable_policies()


def _registered_policies() -> list[str]:
    """Every registered eviction policy's name, the offline ``clairvoyant`` included."""
    from kvcost.eviction import EVICTION_POLICIES

    return list(EVICTION_POLICIES)


class EvictNodeOut(BaseModel):
    """One node in eviction order with its value terms."""

    node_id: int
    p_reuse: float | None = Field(description="P(reuse within H) (cost_aware); null for other policies")
    prefill_saved_s: float
    size_bytes: float
    restore_s: float | None = Field(description="null = drop only")
    value: float = Field(description="the policy's value; lower is evicted first (within the leaf rule)")


class EvictRankResponse(BaseModel):
    """Nodes in eviction order (first = evict first)."""

    policy: str
    now_s: float
    horizon_s: float | None = Field(
        description="the H cost_aware's P(reuse) was computed for, seconds; null for others"
    )
    reuse_model: str | None = Field(
        description="cost_aware's P(reuse): recency_prior, CureReuseModel or ReuseClassifier; null for other policies"
    )
    nodes: list[EvictNodeOut]
