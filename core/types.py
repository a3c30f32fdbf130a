"""Parameter and result objects at the router's boundary.

Plain frozen dataclasses; the HTTP wire format gets its own pydantic models.
All times in seconds, all sizes in tokens or blocks as the names say.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvcost.core.composition import CalibratedTTFT, TermPredictions

#: Tier codes used by ``reusable_tier`` (docs/architecture.md §2 tiers); 0 means no reusable prefix.
TIER_CODES: dict[str, int] = {"none": 0, "gpu": 1, "cpu": 2, "disk": 3, "remote": 4}

#: Worker id under which the shared remote store's blocks are indexed (tier ``"remote"``).
REMOTE_STORE_ID = -1


@dataclass(frozen=True, slots=True)
class Namespace:
    """Compatibility key of a KV cache (docs/architecture.md §2).

    Two requests can share KV only within the same namespace: same model and
    revision, adapter (LoRA), block size, KV layout (dtype, tensor-parallel
    split) and cache salt.
    """

    model: str
    revision: str = "main"
    adapter: str = ""
    block_size_tokens: int = 512
    kv_layout: str = "bf16-tp1"
    cache_salt: str = ""


@dataclass(frozen=True, slots=True)
class DirectoryMatch:
    """Longest compatible prefix of one request on one worker.

    Attributes:
        worker_id: the candidate worker.
        reusable_blocks: number of leading full blocks the directory says the worker holds.
        tier: tier name of the deepest matched block (``"none"`` when 0 blocks); when the
            worker holds that block in several tiers, the fastest (lowest ``TIER_CODES`` code).
        age_s: seconds since the directory last heard from this worker (``inf`` if never).
        stale: the worker's event stream lost messages that could not be replayed, so its
            entries may be wrong beyond the usual lag (see :meth:`CacheDirectory.mark_stale`).
    """

    worker_id: int
    reusable_blocks: int
    tier: str
    age_s: float
    stale: bool = False

    @property
    def tier_code(self) -> int:
        """Integer code of :attr:`tier` from ``TIER_CODES``."""
        return TIER_CODES[self.tier]


def reusable_tokens_for(reusable_blocks: int, block_size_tokens: int, input_tokens: int) -> int:
    """Tokens of a prompt that a cached prefix of ``reusable_blocks`` full blocks saves.

    At least one prompt token is always computed (its logits give the first
    output token), as vLLM does when a prompt is fully cached; so the result is
    ``min(reusable_blocks × block_size_tokens, input_tokens − 1)``, never negative.
    """
    return max(0, min(reusable_blocks * block_size_tokens, input_tokens - 1))


def blocks_to_allocate(input_tokens: int, reusable_tokens: int, block_size_tokens: int) -> int:
    """KV blocks a request allocates at admission: its prompt's blocks less the cached prefix it reuses, ≥ 0.

    ``ceil(input_tokens / block_size_tokens) − floor(reusable_tokens / block_size_tokens)`` (the reused
    prefix is whole blocks, already held; the partial last block is always new).
    """
    return max(0, -(-input_tokens // block_size_tokens) - reusable_tokens // block_size_tokens)


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """One request to route.

    Attributes:
        request_id: caller's id (in replay: the 0-based line of the trace file).
        arrival_s: arrival time at the router, seconds on the caller's clock.
        input_tokens: prompt length (≥ 1).
        block_hashes: chained hashes of the prompt's *full* blocks, prompt order.
        namespace: KV compatibility key (model, revision, adapter, block size ...).
    """

    request_id: int
    arrival_s: float
    input_tokens: int
    block_hashes: tuple[int, ...]
    namespace: Namespace


@dataclass(frozen=True, slots=True)
class WorkerSnapshot:
    """Load of one candidate worker at decision time.

    Attributes:
        worker_id: worker index.
        gpu: GPU type name (a key of ``kvcost.core.hardware.GPUS``); the router
            knows only the type's nominal profile, not the worker's actual speed.
        waiting_prefill: per request not yet done with prefill, FCFS order:
            ``(remaining_prefill_tokens, context_tokens)`` where context is what is
            already in KV (computed chunks and reused prefix).
        running_requests: requests in decode (one token per step each).
        decode_context_tokens: sum of the decoding requests' KV lengths (tokens read per step).
        kv_usage: blocks used by running requests / capacity, in [0, 1].
        idle_cached_blocks: cached blocks with reference count 0.
        recent_step_s: duration of the last finished step (0 if none yet).
        step_remaining_s: time left in the step now running (0 when idle).
        kv_capacity_blocks: the worker's KV capacity in blocks (vLLM reports
            ``num_gpu_blocks``); 0 when unknown.
        waiting_prompt_blocks: KV blocks admitting the requests not yet admitted takes from the
            free and idle cached blocks: their prompt blocks less the cached prefix the router
            predicted for them where it is known (:func:`blocks_to_allocate`), plus the blocks of
            those prefixes that are cached and idle, each once (admission pins them). The
            simulator knows the idle ones from its block pool, the gateway from what it routed
            (its queued requests' stored prefixes less its decoders' prompts); a scraped engine's
            figure counts whole prompts.
        oldest_waiting_s: how long the oldest not-yet-admitted request has waited.
        recent_step_nominal_s: what the GPU type's profile predicts for the last
            step's batch; ``recent_step_s`` ÷ this exposes stragglers. 0 if unknown.
        load_backlog_s: time until the worker's CPU → GPU link is free (KV loads queued), ≥ 0.
        transfer_backlog_s: time until its inbound network link is free (transfers queued), ≥ 0.
        namespace: the KV namespace the worker serves (model, revision, adapter,
            block size, KV layout, cache salt); None = compatible with any request.
        running_output_tokens: output tokens each decoding request has produced so far, one
            count per running request, any order (the gateway counts the tokens it streamed; a
            replay reads its decoders); empty = unknown. The KV-wait estimate uses it only when
            it has ``running_requests`` entries.
    """

    worker_id: int
    gpu: str
    waiting_prefill: tuple[tuple[int, int], ...]
    running_requests: int
    decode_context_tokens: int
    kv_usage: float
    idle_cached_blocks: int
    recent_step_s: float
    step_remaining_s: float
    kv_capacity_blocks: int = 0
    waiting_prompt_blocks: int = 0
    oldest_waiting_s: float = 0.0
    recent_step_nominal_s: float = 0.0
    load_backlog_s: float = 0.0
    transfer_backlog_s: float = 0.0
    namespace: Namespace | None = None
    running_output_tokens: tuple[int, ...] = ()

    @property
    def waiting_requests(self) -> int:
        """Requests not yet done with prefill."""
        return len(self.waiting_prefill)

    @property
    def queued_prefill_tokens(self) -> int:
        """Prefill tokens left in the queue."""
        return sum(remaining for remaining, _ in self.waiting_prefill)


#: Where a candidate's reusable prefix would come from (``ReusePlan.option``).
REUSE_OPTIONS: tuple[str, ...] = ("local", "fetch")


@dataclass(frozen=True, slots=True)
class ReusePlan:
    """Where one candidate's reusable prefix comes from, block counts in prompt order.

    The prefix is ``gpu_blocks`` already in GPU memory, then ``cpu_blocks`` and
    ``disk_blocks`` loaded from the worker's own lower tiers, then
    ``fetch_blocks`` moved over the network from ``source_id`` (another worker,
    or the remote store) into the worker's CPU memory and loaded from there.

    Attributes:
        option: ``"local"`` (the worker's own tiers) or ``"fetch"`` (plus a transfer).
        gpu_blocks, cpu_blocks, disk_blocks, fetch_blocks: ≥ 0.
        source_id: where fetched blocks come from; None when ``fetch_blocks`` is 0.
        conversion_factor: extra time of a KV-layout conversion, as a multiple of the
            network transfer time (0 for an identical layout).
    """

    option: str
    gpu_blocks: int
    cpu_blocks: int = 0
    disk_blocks: int = 0
    fetch_blocks: int = 0
    source_id: int | None = None
    conversion_factor: float = 0.0

    @property
    def reusable_blocks(self) -> int:
        """All blocks of the prefix, whatever their origin."""
        return self.gpu_blocks + self.cpu_blocks + self.disk_blocks + self.fetch_blocks

    @property
    def loaded_blocks(self) -> int:
        """Blocks copied into GPU memory at admission (lower tiers and fetched)."""
        return self.cpu_blocks + self.disk_blocks + self.fetch_blocks


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """The router's answer for one request.

    Attributes:
        request_id: echoed from the request.
        worker_id: chosen worker.
        chosen_index: index of the chosen worker among ``worker_ids``.
        worker_ids: candidates, shape ``(n_candidates,)``.
        reason: one-line human-readable reason.
        matches: directory match per candidate.
        reusable_tokens: int64 ``(n_candidates,)``, tokens the directory says are reusable.
        features: float64 ``(n_candidates, len(FEATURE_SPEC))``.
        predictions: predicted terms per candidate.
        calibrated: calibrated TTFT per candidate when the cost model is learned, else None.
        plans: per candidate, where its reusable prefix comes from (``()`` when the
            router considers only GPU-resident prefixes).
        directory_blocks: per candidate, the leading blocks the directory itself holds for
            it (KV events, or routed prefixes in approximate mode), before the prefixes of
            requests still in flight are counted (``matches`` counts those); ``()`` when
            not recorded.
        expected_reuse_tokens: int64 ``(n_candidates,)``, ``reusable_tokens`` less the part
            expected to be evicted before admission
            (:func:`~kvcost.routing.promise_survival.expected_reuse_tokens`): what the work this
            request adds to its worker's queue is counted net of. None: the same as ``reusable_tokens``.
    """

    request_id: int
    worker_id: int
    chosen_index: int
    worker_ids: tuple[int, ...]
    reason: str
    matches: tuple[DirectoryMatch, ...]
    reusable_tokens: np.ndarray
    features: np.ndarray
    predictions: TermPredictions
    calibrated: CalibratedTTFT | None = None
    plans: tuple[ReusePlan, ...] = ()
    directory_blocks: tuple[int, ...] = ()
    expected_reuse_tokens: np.ndarray | None = None

    def queued_reuse(self) -> np.ndarray:
        """Per candidate, the reuse the work this request would add to its queue is counted net of, tokens
        ``(n_candidates,)``: ``expected_reuse_tokens`` where given, else ``reusable_tokens``."""
        return self.reusable_tokens if self.expected_reuse_tokens is None else self.expected_reuse_tokens

    def queued_reuse_tokens(self) -> int:
        """:meth:`queued_reuse` of the chosen worker, tokens."""
        return int(self.queued_reuse()[self.chosen_index])
