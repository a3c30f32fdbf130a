"""Summary figures of one replay (the per-configuration block of ``summary.json``)."""

from __future__ import annotations

import numpy as np

from kvcost.core.types import reusable_tokens_for
from kvcost.data.traces import Trace
from kvcost.features.nominal import NominalCosts
from kvcost.replay.config import ClusterConfig
from kvcost.replay.simulator import ReplayResult

#: Keys of one configuration's summary, in report order.
SUMMARY_KEYS: tuple[str, ...] = (
    "completed",
    "rejected",
    "preemptions",
    "eviction_policy",
    "evicted_blocks",
    "ttft_mean_s",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "hit_ratio",
    "reused_tokens_mean",
    "queue_p99_s",
    "kv_wait_share",
    "max_worker_share",
    "directory_mismatch_tokens",
    "mismatch_lost_s",
    "promised_recomputed_share",
    "promised_in_flight_share",
    "in_flight_recomputed_share",
    "served_by",
    "utilisation",
)

#: Where a request's reused prefix came from (``requests.served_by``), report order.
SERVED_BY: tuple[str, ...] = ("local_hit", "tier_load", "remote_transfer", "recompute")


def _share(part: float, whole: float) -> float:
    """``part / whole`` as a float, NaN when ``whole`` is 0."""
    return float(part / whole) if whole else float("nan")


def _quantile(values: np.ndarray, q: float) -> float:
    values = values[~np.isnan(values)]
    return float(np.quantile(values, q)) if values.size else float("nan")


def _in_flight_shares(r) -> dict[str, float]:
    """``promised_in_flight_share`` and ``in_flight_recomputed_share`` of :func:`summarise`."""
    in_flight = (r["predicted_reuse_tokens"] - r["directory_reuse_tokens"]).clip(lower=0)
    lost = np.minimum(r["directory_mismatch_tokens"], in_flight)
    return {
        "promised_in_flight_share": _share(in_flight.sum(), r["predicted_reuse_tokens"].sum()),
        "in_flight_recomputed_share": _share(lost.sum(), in_flight.sum()),
    }


def summarise(result: ReplayResult, n_workers: int) -> dict[str, float | int]:
    """Figures of one configuration.

    ``rejected`` counts requests too large for any worker's KV capacity; ``preemptions`` the
    recompute preemptions of decoders that found the KV pool full (as vLLM preempts);
    ``eviction_policy`` the policy the workers evicted by (None with the cache off), ``evicted_blocks``
    the cached blocks they evicted (0: the eviction order decided nothing).
    ``hit_ratio`` is token-weighted: actually reused tokens / input tokens.
    ``kv_wait_share`` is the share of queue time spent waiting for KV memory at the head
    of the queue (Σ ``kv_wait_s`` ÷ Σ ``actual_queue_s``, NaN without queueing).
    ``max_worker_share`` is the largest fraction of requests any one worker
    served. ``utilisation`` is the mean over workers of the fraction of the
    measured span during which the worker had a request waiting for its first
    token (queued or in prefill): the busy fraction of the prefill server, 1
    when its queue never empties. Times in seconds.

    ``served_by`` is the share of requests whose prefix came from the GPU only
    (``local_hit``), from the worker's CPU / disk tiers (``tier_load``), over the
    network from another worker or the remote store (``remote_transfer``), or
    was not reused (``recompute``). ``mismatch_lost_s`` is the nominal prefill
    time of the tokens the directory promised but the worker no longer held.
    ``promised_recomputed_share`` is the share of the promised tokens (the raw
    directory match on the chosen worker at decision time, ``predicted_reuse_tokens``)
    that were recomputed at admission (``directory_mismatch_tokens``); NaN when
    nothing was promised. ``promised_in_flight_share`` is the part of the promised
    tokens the directory did not report stored (``predicted_reuse_tokens −
    directory_reuse_tokens``, counted from the router's in-flight prefixes), and
    ``in_flight_recomputed_share`` the share of that part recomputed at admission,
    taking each request's recomputed tokens from the in-flight part first (it is the
    deep end of the prefix, and a prefix is lost from its end); both NaN when their
    whole is 0.
    """
    r = result.requests
    if r.empty:
        counts = ("completed", "rejected", "preemptions", "evicted_blocks", "directory_mismatch_tokens")
        empty = {key: 0 if key in counts else float("nan") for key in SUMMARY_KEYS}
        empty.update(
            rejected=result.rejected_requests,
            preemptions=result.preemptions,
            eviction_policy=result.eviction_policy,
            evicted_blocks=result.evicted_blocks,
        )
        return {**empty, "served_by": dict.fromkeys(SERVED_BY, 0.0)}
    served = r["served_by"].value_counts(normalize=True)
    ttft = r["actual_ttft_s"].to_numpy()
    counts = np.bincount(r["worker_id"].to_numpy(), minlength=n_workers)
    return {
        "completed": int(len(r)),
        "rejected": int(result.rejected_requests),
        "preemptions": int(result.preemptions),
        "eviction_policy": result.eviction_policy,
        "evicted_blocks": int(result.evicted_blocks),
        "ttft_mean_s": float(ttft.mean()),
        "ttft_p50_s": _quantile(ttft, 0.50),
        "ttft_p90_s": _quantile(ttft, 0.90),
        "ttft_p99_s": _quantile(ttft, 0.99),
        "tpot_p50_s": _quantile(r["tpot_s"].to_numpy(dtype=float), 0.50),
        "hit_ratio": float(r["actual_reuse_tokens"].sum() / r["input_tokens"].sum()),
        "reused_tokens_mean": float(r["actual_reuse_tokens"].mean()),
        "queue_p99_s": _quantile(r["actual_queue_s"].to_numpy(), 0.99),
        "kv_wait_share": _share(r["kv_wait_s"].sum(), r["actual_queue_s"].sum()),
        "max_worker_share": float(counts.max() / counts.sum()),
        "directory_mismatch_tokens": int(r["directory_mismatch_tokens"].sum()),
        "mismatch_lost_s": float(r["mismatch_lost_s"].sum()),
        "promised_recomputed_share": _share(r["directory_mismatch_tokens"].sum(), r["predicted_reuse_tokens"].sum()),
        **_in_flight_shares(r),
        "served_by": {name: float(served.get(name, 0.0)) for name in SERVED_BY},
        "utilisation": float(np.mean(result.utilisation)),
    }


def p99_by_window(results: dict[str, ReplayResult], window_s: float) -> dict:
    """TTFT P99 per arrival window of ``window_s`` replay seconds, per configuration (``None`` for empty windows)."""
    out: dict = {"window_s": window_s}
    for name, result in results.items():
        r = result.requests
        windows = (r["arrival_s"] // window_s).astype(int)
        p99 = r.groupby(windows)["actual_ttft_s"].quantile(0.99)
        out[name] = [float(p99[w]) if w in p99.index else None for w in range(int(windows.max()) + 1)]
    return out


def infinite_cache_reuse_tokens(trace: Trace) -> list[int]:
    """Tokens each request reuses from one infinite, never-evicting cache shared by all workers.

    A request reuses the longest prefix of its full blocks seen in any earlier
    request, capped at ``input_tokens − 1`` (as the simulator does); a partial
    last block is never cached. One entry per request, in trace order.
    """
    seen: set[int] = set()
    reused: list[int] = []
    for request in trace.requests:
        full = request.block_hashes[: request.input_tokens // trace.block_size_tokens]
        n = 0
        while n < len(full) and full[n] in seen:
            n += 1
        reused.append(reusable_tokens_for(n, trace.block_size_tokens, request.input_tokens))
        seen.update(full)
    return reused


def infinite_cache_hit_ratio(trace: Trace) -> float:
    """Token-weighted hit ratio with one infinite, never-evicting cache shared by all workers.

    Reused tokens of :func:`infinite_cache_reuse_tokens` over input tokens; the
    bound against which the measured hit ratios are read. docs/architecture.md §8 quotes
    ≈ 36.6 % *block* hit ratio for the conversation trace; this figure is
    token-weighted.
    """
    total = sum(r.input_tokens for r in trace.requests)
    return sum(infinite_cache_reuse_tokens(trace)) / total if total else 0.0


def isolated_ttft_s(trace: Trace, config: ClusterConfig, costs: NominalCosts | None = None) -> np.ndarray:
    """Each request's TTFT with an infinite shared cache, no queue, on the fleet's fastest GPU type.

    TTFT = L + P + F: lookup of its full blocks + prefill of the tokens not in
    the infinite cache (:func:`infinite_cache_reuse_tokens`), alone on a worker
    in chunks of ``config.token_budget`` (``StepTimeModel.prefill_alone_s``, no
    jitter) + first-token work; nominal costs by default. Seconds, one per request.
    """
    costs = costs or NominalCosts()
    models = [config.step_model(gpu) for gpu in sorted(set(config.fleet))]
    reused = infinite_cache_reuse_tokens(trace)
    out = np.empty(len(trace.requests))
    for i, (request, cached) in enumerate(zip(trace.requests, reused, strict=True)):
        prefill_s = min(m.prefill_alone_s(request.input_tokens - cached, cached) for m in models)
        lookup_s = costs.lookup_s(request.input_tokens // trace.block_size_tokens)
        out[i] = lookup_s + prefill_s + costs.first_token_s
    return out


def physical_limit_ttft_p99_s(trace: Trace, config: ClusterConfig) -> float:
    """The workload's physical limit: TTFT P99 of :func:`isolated_ttft_s` (no router can beat it).

    About 13.7 s for the bundled conversation trace with Llama-3-8B on A100.
    """
    return _quantile(isolated_ttft_s(trace, config), 0.99)
