"""The experiment that separates cache gain, routing gain, tier gain and eviction gain (docs/architecture.md §4).

The same arrival trace is replayed under

1. ``balanced_nocache`` — ``least_loaded`` routing, prefix cache off;
2. ``balanced_cache`` — ``least_loaded`` routing, prefix cache on;
3. ``cost_aware`` — routing that weighs cache reuse and load together;
4. ``cost_aware_tiered`` — the same with CPU / disk tiers, a remote store and a
   router that weighs tier loads and transfers against recompute;
5. ``cost_aware_evicting`` — arm 3 with the workers' caches evicting by kvcost's
   ``cost_aware`` value instead of the run's eviction policy (``lru`` unless
   ``--eviction-policy`` says otherwise; the arm is left out when it is already ``cost_aware``).

Cache gain = 1 → 2, routing gain = 2 → 3, tier gain = 3 → 4, eviction gain = 3 → 5
(positive = TTFT got shorter).
Each run states its initial cache state: cold, or warmed by the trace's first
``warmup_s`` seconds (simulated but not measured).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from kvcost.data.traces import Trace
from kvcost.models.term_set import TermModelSet
from kvcost.replay.config import ClusterConfig
from kvcost.replay.engine_eviction import engine_eviction
from kvcost.replay.metrics import summarise
from kvcost.replay.online import OnlineSettings
from kvcost.replay.simulator import ClusterSimulator, ReplayResult
from kvcost.replay.tiers import TierConfig


@dataclass(frozen=True, slots=True)
class Configuration:
    """One arm of the experiment: a router policy, whether the prefix cache is on, whether tiers are.

    ``tiered``: CPU / disk tiers behind every GPU and a shared remote store, and a
    router that weighs tier loads and transfers (``RouterSettings.tiers`` and
    ``transfers``). ``eviction_policy``: how this arm's workers evict (a registered
    :mod:`kvcost.eviction` policy); None = the run's (``ClusterConfig.eviction_policy``).
    """

    name: str
    policy: str
    cache_enabled: bool
    tiered: bool = False
    eviction_policy: str | None = None


CONFIGURATIONS: tuple[Configuration, ...] = (
    Configuration("balanced_nocache", "least_loaded", False),
    Configuration("balanced_cache", "least_loaded", True),
    Configuration("cost_aware", "cost_aware", True),
    Configuration("cost_aware_tiered", "cost_aware", True, tiered=True),
    Configuration("cost_aware_evicting", "cost_aware", True, eviction_policy="cost_aware"),
)
#: Each gain of :func:`attribution`: (name, the arm before, the arm after).
GAINS: tuple[tuple[str, str, str], ...] = (
    ("cache", "balanced_nocache", "balanced_cache"),
    ("routing", "balanced_cache", "cost_aware"),
    ("tier", "cost_aware", "cost_aware_tiered"),
    ("eviction", "cost_aware", "cost_aware_evicting"),
)
#: The arm added by ``kvcost experiment --learned`` / ``--online``: routing by the learned models.
LEARNED_ARM = Configuration("learned_cost_aware", "learned_cost_aware", True)


def configure(base: ClusterConfig, arm: Configuration) -> ClusterConfig:
    """``base`` with the arm's policy, cache switch, tiers (``base.tiers``, or the defaults) and eviction policy."""
    router = replace(base.router, policy=arm.policy, tiers=arm.tiered, transfers=arm.tiered)
    tiers = (base.tiers or TierConfig()) if arm.tiered else None
    eviction_policy = arm.eviction_policy or base.eviction_policy
    return replace(base, cache_enabled=arm.cache_enabled, router=router, tiers=tiers, eviction_policy=eviction_policy)


def replay(
    trace: Trace,
    config: ClusterConfig,
    progress: Callable[[int], None] | None = None,
    cost_model: TermModelSet | None = None,
    online: OnlineSettings | None = None,
) -> ReplayResult:
    """Replay ``trace`` once under ``config`` (optionally with a learned or online-learned cost model).

    The workers evict by ``config.eviction_policy`` with what that policy needs
    (:func:`~kvcost.replay.engine_eviction.engine_eviction`: a P(reuse) refitted during the replay for
    ``cost_aware``, the trace's future for the ``clairvoyant`` reference).
    """
    context, refit = engine_eviction(trace, config.eviction_policy) if config.cache_enabled else (None, None)
    simulator = ClusterSimulator(
        config, trace.block_size_tokens, cost_model, online, eviction=context, reuse_refit=refit
    )
    return simulator.run(trace, progress)


def attribution(configs: dict[str, dict]) -> dict[str, float]:
    """Each gain of :data:`GAINS` whose two arms ran, at P50 and P99 TTFT: ``<gain>_gain_p50_s``, ``…_p99_s``.

    Positive = TTFT got shorter. The tier and eviction gains are there when their arm ran.
    """
    gains = {}
    for gain, before, after in GAINS:
        if before in configs and after in configs:
            for q in ("p50", "p99"):
                gains[f"{gain}_gain_{q}_s"] = configs[before][f"ttft_{q}_s"] - configs[after][f"ttft_{q}_s"]
    return gains


def attribution_lines(gains: dict[str, float]) -> list[str]:
    """One line per gain of :func:`attribution`, e.g. ``"cache gain (balanced_nocache → balanced_cache): P50
    +1.690 s, P99 +11.660 s"``."""
    return [
        f"{gain} gain ({before} → {after}): P50 {gains[f'{gain}_gain_p50_s']:+.3f} s, "
        f"P99 {gains[f'{gain}_gain_p99_s']:+.3f} s"
        for gain, before, after in GAINS
        if f"{gain}_gain_p99_s" in gains
    ]


def diagnose(configs: dict[str, dict], results: dict[str, ReplayResult]) -> list[str]:
    """docs/architecture.md §4's diagnosis, in its order, each line backed by a number from the log."""
    if any(results[name].requests.empty for name in ("balanced_cache", "cost_aware")):
        return [
            "No diagnosis: no measured request completed (each was larger than a worker's KV capacity, "
            "or none arrived after the warm-up)."
        ]
    lines = [_hot_worker_queueing(configs, results), _mismatch(configs, results), _recompute_squeeze(results)]
    if "cost_aware_tiered" in configs:
        lines.append(_tiers(configs))
    if "cost_aware_evicting" in configs:
        lines.append(_eviction(configs))
    return lines


def _eviction(configs: dict[str, dict]) -> str:
    """What the workers evicting by kvcost's value changed against the run's own eviction policy."""
    flat, evicting = configs["cost_aware"], configs["cost_aware_evicting"]
    return (
        f"kvcost's eviction in the workers: cost_aware_evicting (evicting by {evicting['eviction_policy']}) vs "
        f"cost_aware (by {flat['eviction_policy']}): hit ratio {evicting['hit_ratio']:.1%} vs "
        f"{flat['hit_ratio']:.1%}, {evicting['evicted_blocks']} vs {flat['evicted_blocks']} blocks evicted, "
        f"promised tokens recomputed {evicting['promised_recomputed_share']:.1%} vs "
        f"{flat['promised_recomputed_share']:.1%}, TTFT P99 {evicting['ttft_p99_s']:.2f} s vs "
        f"{flat['ttft_p99_s']:.2f} s."
    )


def _tiers(configs: dict[str, dict]) -> str:
    """Where the prefixes came from with and without tiers, and whether that paid off at P99."""
    flat, tiered = configs["cost_aware"], configs["cost_aware_tiered"]

    def split(c: dict) -> str:
        return ", ".join(f"{name} {share:.1%}" for name, share in c["served_by"].items())

    return (
        f"Tiers and transfers: cost_aware_tiered hit ratio {tiered['hit_ratio']:.1%} vs {flat['hit_ratio']:.1%}, "
        f"TTFT P99 {tiered['ttft_p99_s']:.2f} s vs {flat['ttft_p99_s']:.2f} s. Requests served by: {split(tiered)} "
        f"(cost_aware: {split(flat)}). Directory mismatches cost {tiered['directory_mismatch_tokens']} tokens, "
        f"{tiered['mismatch_lost_s']:.1f} s of prefill (cost_aware: {flat['directory_mismatch_tokens']} tokens, "
        f"{flat['mismatch_lost_s']:.1f} s)."
    )


def _hot_worker_queueing(configs: dict[str, dict], results: dict[str, ReplayResult]) -> str:
    base, cost = configs["balanced_cache"], configs["cost_aware"]
    higher_hit = cost["hit_ratio"] > base["hit_ratio"]
    worse_p99 = cost["ttft_p99_s"] > base["ttft_p99_s"]
    queue = results["cost_aware"].requests.groupby("worker_id")["actual_queue_s"].quantile(0.99)
    hot = int(queue.idxmax())
    verdict = (
        "TRIGGERED: higher hit ratio with worse P99 — look at queueing on hot workers"
        if higher_hit and worse_p99
        else "not triggered"
    )
    return (
        f"Hot-worker queueing ({verdict}): cost_aware hit ratio {cost['hit_ratio']:.1%} vs "
        f"{base['hit_ratio']:.1%}, TTFT P99 {cost['ttft_p99_s']:.2f} s vs {base['ttft_p99_s']:.2f} s; "
        f"queue P99 {cost['queue_p99_s']:.2f} s vs {base['queue_p99_s']:.2f} s; busiest queue is worker {hot} "
        f"(P99 {queue.max():.2f} s), max worker share {cost['max_worker_share']:.1%}."
    )


def _mismatch(configs: dict[str, dict], results: dict[str, ReplayResult]) -> str:
    r = results["cost_aware"].requests
    promised = int(r["predicted_reuse_tokens"].sum())
    missed = int(r["directory_mismatch_tokens"].sum())
    n_missed = int((r["directory_mismatch_tokens"] > 0).sum())
    share = missed / promised if promised else 0.0
    lookup_p99_ms = float(r["actual_lookup_s"].quantile(0.99)) * 1e3
    return (
        f"Preparation and directory mismatches: lookup P99 {lookup_p99_ms:.2f} ms; {n_missed} of {len(r)} "
        f"cost_aware requests found less prefix than the directory promised, {missed} of {promised} promised "
        f"tokens ({share:.1%}) were recomputed."
    )


def _recompute_squeeze(results: dict[str, ReplayResult]) -> str:
    r = results["cost_aware"].requests
    samples = results["cost_aware"].worker_samples
    missed = r[r["directory_mismatch_tokens"] > 0]
    extra_prefill_s = float((missed["actual_prefill_s"] - missed["pred_prefill_s"]).clip(lower=0).sum())
    kv_p90 = float(samples["kv_usage"].quantile(0.90)) if not samples.empty else 0.0
    idle_mean = float(samples["idle_cached_blocks"].mean()) if not samples.empty else 0.0
    squeezed = kv_p90 > 0.9
    verdict = "TRIGGERED" if len(missed) and squeezed else "not triggered"
    return (
        f"Recompute of expected hits ({verdict}): {len(missed)} of {len(r)} cost_aware requests recomputed "
        f"promised prefixes, {extra_prefill_s:.1f} s of prefill above prediction. Active requests held P90 "
        f"{kv_p90:.0%} of KV while idle cached blocks averaged {idle_mean:.0f} per worker: "
        + (
            "active requests squeeze the idle cache, so prefixes are evicted before their reuse."
            if squeezed
            else "KV is not saturated, so eviction is not forced by active requests."
        )
    )


def study_summary(results: dict[str, ReplayResult], n_workers: int) -> dict:
    """Per-configuration figures; with the three experiment arms, also the attribution and diagnosis."""
    configs = {name: summarise(res, n_workers) for name, res in results.items()}
    if not {arm.name for arm in CONFIGURATIONS if not arm.tiered and arm.eviction_policy is None} <= set(configs):
        return {"configs": configs}
    summary = {"configs": configs, "attribution": attribution(configs), "diagnosis": diagnose(configs, results)}
    if LEARNED_ARM.name in configs:
        learned, analytic = configs[LEARNED_ARM.name], configs["cost_aware"]
        summary["attribution"]["learned_gain_p50_s"] = analytic["ttft_p50_s"] - learned["ttft_p50_s"]
        summary["attribution"]["learned_gain_p99_s"] = analytic["ttft_p99_s"] - learned["ttft_p99_s"]
    online = results.get(LEARNED_ARM.name)
    if online is not None and online.retrains:
        summary["online"] = {"retrains": list(online.retrains), "drift_alerts": list(online.drift_alerts)}
    if online is not None and online.served_coverage_90 is not None:
        # coverage as a live fleet sees it (kvcost issue 13 §4): each request against the bound served when routed
        summary["served_coverage_90"] = online.served_coverage_90
    return summary
