"""``kvcost eviction-study``: every eviction policy at several GPU cache sizes, same trace, routing and seed.

Cache sizes are fractions of the trace window's distinct blocks (every hash
id, the partial last block included: 182,790 for the bundled conversation
trace). Each worker gets ``kv_capacity_blocks`` = fraction × distinct ÷
workers. This is a **what-if capacity**: 4 × A100 with Llama-3-8B really hold
about 880 blocks of 512 tokens per worker (64 MiB each), far below 5 % of the
trace; the study asks how the policies compare when more of the working set
fits, not what an A100 holds.

No leakage: per cache size, the first ``train_fraction`` of the window's
trace time is replayed with ``lru`` while the pools log their block history;
the reuse model of ``cost_aware`` is fitted on that log alone (H = the
median idle time of evicted blocks in that log, Che's characteristic time,
unless ``horizon_s`` is given). Every policy then replays the whole window
and is measured only on requests arriving after the split (the first part is
the warm-up). All runs route with ``cost_aware`` (the default router) so only
eviction differs.

Which P(reuse) ``cost_aware`` uses (``reuse_model``): ``cure`` (default), the
:class:`~kvcost.models.reuse_cure.CureReuseModel` fitted on the training log's
idle periods (a share π of blocks used again after a log-normal gap, the rest
never; per class of the last request's reused share; open gaps censored);
``prior``, exp(−idle / H) with H measured on the training log; or
``lightgbm``, the :class:`~kvcost.models.reuse.ReuseClassifier` fitted on it
with :data:`~kvcost.models.reuse.STUDY_FEATURES` and monotone constraints.

The default, ``cure``, was chosen on validation replays inside the training
period only (the first 30 % of the conversation trace's time), never on the
window it is evaluated on; the figures, the evaluation window and the variants
tried and not adopted are in ``docs/eviction-study.md``.

Figures per run: token hit ratio; prefill seconds saved = Σ over measured
requests of the GPU type's nominal prefill of the whole prompt minus the
prefill of its uncached part after the reused prefix
(:meth:`StepTimeModel.prefill_alone_s` on an idle worker: the compute the
cache saved, independent of queueing); TTFT P50/P99. Runs go to ``jobs``
processes like ``kvcost bench``; results do not depend on ``jobs``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import pandas as pd

from kvcost.core.hardware import StepTimeModel
from kvcost.core.plots import plot_eviction_study
from kvcost.core.reporting import markdown_table, write_json
from kvcost.data.store import LogStore
from kvcost.data.traces import Trace, check_trace_name, load_trace
from kvcost.eviction import EVICTION_POLICIES, EvictionContext
from kvcost.models.reuse import (
    REUSE_MODELS,
    ReuseModel,
    characteristic_time_s,
    load_reuse_model,
    reuse_training_frame,
    saved_reuse_model,
)
from kvcost.models.reuse_cure import CureReuseModel
from kvcost.replay.config import ClusterConfig
from kvcost.replay.engine_eviction import next_use_table
from kvcost.replay.metrics import summarise
from kvcost.replay.reuse_refit import ReuseRefit
from kvcost.replay.settings import DEFAULT_RATE_SCALE, DEFAULT_REFIT_EVERY_S, DEFAULT_TRACE
from kvcost.replay.simulator import ClusterSimulator, ReplayResult

#: Policies in report order; ``clairvoyant`` is the offline reference (it reads the trace's future).
STUDY_POLICIES: tuple[str, ...] = ("lru", "lfu", "gdsf", "lhd", "flop_aware", "cost_aware", "clairvoyant")
#: Default cache sizes, fractions of the distinct blocks.
DEFAULT_FRACTIONS: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5)
#: Share of the window's trace time replayed to fit the reuse model (and warm every run).
DEFAULT_TRAIN_FRACTION = 0.3
#: File name of the training part's block history log, in each cache size's reuse-model folder.
BLOCK_EVENTS_DB = "block_events.duckdb"
#: Re-rank period of the time-varying policies, simulated seconds (assumption: ≪ H, cheap enough).
DEFAULT_RERANK_INTERVAL_S = 10.0


@dataclass(frozen=True)
class StudySettings:
    """Inputs of one study (validated by :func:`check_settings`)."""

    trace: str = DEFAULT_TRACE
    duration_s: float | None = None
    fractions: tuple[float, ...] = DEFAULT_FRACTIONS
    policies: tuple[str, ...] = STUDY_POLICIES
    workers: int = 4
    rate_scale: float = DEFAULT_RATE_SCALE
    seed: int = 0
    train_fraction: float = DEFAULT_TRAIN_FRACTION
    horizon_s: float | None = None
    rerank_interval_s: float = DEFAULT_RERANK_INTERVAL_S
    jobs: int = 2
    reuse_model: str = "cure"
    refit_every_s: float | None = DEFAULT_REFIT_EVERY_S


def check_settings(s: StudySettings) -> None:
    """Raise ``ValueError`` / ``KeyError`` naming the first bad setting (the trace by name, not loaded)."""
    check_trace_name(s.trace)
    if not s.fractions:
        raise ValueError("fractions is empty, expected cache fractions in (0, 1] such as 0.05,0.1")
    for f in s.fractions:
        if not 0 < f <= 1:
            raise ValueError(f"fractions contains {f!r}, expected numbers in (0, 1]")
    if not s.policies:
        raise ValueError("policies is empty, expected registered eviction policies")
    for name in s.policies:
        if name not in EVICTION_POLICIES:
            raise ValueError(
                f"policies contains {name!r}, expected registered eviction policies: {', '.join(EVICTION_POLICIES)}"
            )
    if s.duration_s is not None and not (s.duration_s > 0 and math.isfinite(s.duration_s)):
        raise ValueError(f"duration_s = {s.duration_s!r}, expected a finite number of seconds > 0 (or none: all)")
    if not (s.rate_scale > 0 and math.isfinite(s.rate_scale)):
        raise ValueError(f"rate_scale = {s.rate_scale!r}, expected a finite number > 0")
    if not 0 < s.train_fraction < 1:
        raise ValueError(f"train_fraction = {s.train_fraction!r}, expected a number in (0, 1)")
    if s.horizon_s is not None and not (s.horizon_s > 0 and math.isfinite(s.horizon_s)):
        raise ValueError(f"horizon_s = {s.horizon_s!r}, expected a finite number > 0")
    if s.refit_every_s is not None and not (s.refit_every_s > 0 and math.isfinite(s.refit_every_s)):
        raise ValueError(f"refit_every_s = {s.refit_every_s!r}, expected a finite number of seconds > 0")
    if s.reuse_model not in REUSE_MODELS:
        raise ValueError(f"reuse_model = {s.reuse_model!r}, expected one of {', '.join(REUSE_MODELS.names())}")
    if s.workers < 1 or s.jobs < 1:
        raise ValueError(f"workers = {s.workers}, jobs = {s.jobs}, expected integers ≥ 1")


@lru_cache(maxsize=4)
def _trace(name: str, duration_s: float | None, rate_scale: float, seed: int) -> Trace:
    return load_trace(name, duration_s=duration_s, rate_scale=rate_scale, spread_seed=seed)


def split_s(trace: Trace, train_fraction: float) -> float:
    """Replay time of the train / measure split: ``train_fraction`` of the window's arrival span."""
    first, last = trace.requests[0].arrival_s, trace.requests[-1].arrival_s
    return first + train_fraction * (last - first)


def _config(s: StudySettings, capacity_blocks: int, policy: str, warmup_s: float) -> ClusterConfig:
    return ClusterConfig(
        fleet=("a100",) * s.workers,
        kv_capacity_blocks=capacity_blocks,
        seed=s.seed,
        warmup_s=warmup_s,
        eviction_policy=policy,
    )


def train_reuse_model(s: StudySettings, fraction: float, capacity_blocks: int, model_dir: Path) -> dict:
    """Replay the training part with ``lru``, log block history, fit and save ``cost_aware``'s P(reuse); returns facts.

    The history goes through the DuckDB log: it is written to the ``block_events`` table of
    ``model_dir/block_events.duckdb`` (run id ``train``, the file made anew) and the model is fitted
    on what is read back, as a deployment would fit it on the engines' logged KV events.
    Every setting saves H (``horizon_s.txt``); the model registered as ``s.reuse_model``
    (:data:`~kvcost.models.reuse.REUSE_MODELS`) is fitted by its ``from_log`` and saved too, unless the
    log cannot support one (``prior`` never fits; ``lightgbm`` needs both label classes, ``cure`` a reuse:
    e.g. nothing evicted at a large cache), where the prior with the measured H stands in.
    """
    trace = _trace(s.trace, s.duration_s, s.rate_scale, s.seed)
    cut_s = split_s(trace, s.train_fraction)
    head = replace(trace, requests=tuple(r for r in trace.requests if r.arrival_s < cut_s))
    sim = ClusterSimulator(_config(s, capacity_blocks, "lru", 0.0), trace.block_size_tokens, record_block_events=True)
    events = _through_the_log(sim.run(head).block_events, model_dir / BLOCK_EVENTS_DB)
    measured_h = characteristic_time_s(events)
    horizon_s = study_horizon_s(s.horizon_s, measured_h, cut_s)
    size_bytes = trace.block_size_tokens * sim.step_models["a100"].model.kv_bytes_per_token
    frame = reuse_training_frame(events, horizon_s, size_bytes, seed=s.seed, end_s=cut_s)
    (model_dir / "horizon_s.txt").write_text(f"{horizon_s!r}\n")
    fitted = REUSE_MODELS.get(s.reuse_model).from_log(events, frame, horizon_s, cut_s)
    if fitted is not None:
        fitted.save(model_dir)
    return {
        "cache_fraction": fraction,
        "horizon_s": horizon_s,
        "characteristic_time_s": measured_h,
        "training_rows": int(len(frame)),
        "positive_share": float(frame["label"].mean()),
        "classifier_fitted": fitted is not None,
        "cure_params": fitted.params if isinstance(fitted, CureReuseModel) else None,
        "block_events": int(len(events)),
    }


def study_horizon_s(given_s: float | None, measured_s: float, training_s: float) -> float:
    """H of ``cost_aware``: the one given, else the training log's characteristic time, else the training
    part's length. A characteristic time that is not > 0 (nothing evicted: NaN; every evicted block went the
    instant it turned idle: 0) measures no survival time."""
    if given_s is not None:
        return given_s
    return measured_s if measured_s > 0 and math.isfinite(measured_s) else training_s


def _through_the_log(events: pd.DataFrame, db: Path) -> pd.DataFrame:
    """Write ``events`` to a fresh DuckDB log at ``db`` (table ``block_events``, run ``train``) and read them back."""
    db.unlink(missing_ok=True)
    with LogStore(db).open() as store:
        store.write_frame("block_events", "train", events)
        return store.read_block_events("train")


def study_reuse_model(model_dir: Path) -> tuple[ReuseModel | None, float]:
    """The P(reuse) model :func:`train_reuse_model` saved in ``model_dir`` (None: the prior) and H, seconds."""
    if saved_reuse_model(model_dir) is None:
        return None, float((model_dir / "horizon_s.txt").read_text())
    model = load_reuse_model(model_dir)
    return model, model.horizon_s


def prefill_saved_s(result: ReplayResult, step_model: StepTimeModel) -> float:
    """Σ over measured requests of nominal prefill(all input) − prefill(uncached part after the reused prefix)."""
    r = result.requests
    total = 0.0
    for tokens, reused in zip(r["input_tokens"].tolist(), r["actual_reuse_tokens"].tolist(), strict=True):
        if reused:
            total += step_model.prefill_alone_s(tokens) - step_model.prefill_alone_s(tokens - reused, reused)
    return total


def run_policy(s: StudySettings, fraction: float, capacity_blocks: int, policy: str, model_dir: Path | None) -> dict:
    """Replay the whole window under ``policy``; measured after the split. Returns the result row."""
    started = time.perf_counter()
    trace = _trace(s.trace, s.duration_s, s.rate_scale, s.seed)
    reuse_model, horizon_s = None, s.horizon_s or 300.0
    if EVICTION_POLICIES.get(policy).uses_reuse_model and model_dir is not None:
        reuse_model, horizon_s = study_reuse_model(model_dir)
    next_use = next_use_table(trace) if EVICTION_POLICIES.get(policy).reads_future else None
    context = EvictionContext(
        horizon_s=horizon_s, rerank_interval_s=s.rerank_interval_s, reuse_model=reuse_model, next_use=next_use
    )
    config = _config(s, capacity_blocks, policy, split_s(trace, s.train_fraction))
    refit = None
    if s.refit_every_s is not None and s.reuse_model == "cure" and EVICTION_POLICIES.get(policy).uses_reuse_model:
        refit = ReuseRefit(s.refit_every_s, horizon_s, next_s=split_s(trace, s.train_fraction) + s.refit_every_s)
    sim = ClusterSimulator(config, trace.block_size_tokens, eviction=context, reuse_refit=refit)
    result = sim.run(trace)
    summary = summarise(result, s.workers)
    return {
        "policy": policy,
        "cache_fraction": fraction,
        "kv_capacity_blocks": capacity_blocks,
        "hit_ratio": summary["hit_ratio"],
        "prefill_saved_s": prefill_saved_s(result, sim.step_models["a100"]),
        "ttft_p50_s": summary["ttft_p50_s"],
        "ttft_p99_s": summary["ttft_p99_s"],
        "completed": summary["completed"],
        "rejected": summary["rejected"],
        "runtime_s": time.perf_counter() - started,
        "reuse_refits": len(refit.refits) if refit is not None else 0,
    }


def _map(jobs: int, calls: list[tuple], progress: Callable[[int], None] | None) -> list:
    """Run ``fn(*args)`` for each ``(fn, *args)`` in ``jobs`` processes; results in call order."""
    if jobs <= 1:
        out = []
        for fn, *args in calls:
            out.append(fn(*args))
            if progress:
                progress(1)
        return out
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(fn, *args) for fn, *args in calls]
        out = []
        for future in futures:
            out.append(future.result())
            if progress:
                progress(1)
        return out


def run_study(s: StudySettings, out: Path, progress: Callable[[int], None] | None = None) -> dict:
    """Train per cache size, replay every (size, policy), write ``eviction.json``, ``eviction.md``, ``eviction.png``.

    ``progress(n)`` is called per finished training or replay (total: sizes × (policies + 1)).

    Raises:
        ValueError, KeyError, FileNotFoundError: bad settings or trace, unwritable ``out``.
    """
    check_settings(s)
    started = time.perf_counter()
    trace = _trace(s.trace, s.duration_s, s.rate_scale, s.seed)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"out = {str(out)!r} cannot be created: {exc.strerror}") from None
    distinct = trace.distinct_blocks  # every hash id, the partial last block included
    sizes = [(f, max(1, int(f * distinct / s.workers))) for f in s.fractions]
    train = any(EVICTION_POLICIES.get(p).uses_reuse_model for p in s.policies)
    dirs = {f: out / "reuse_models" / f"fraction_{f:g}" for f, _ in sizes}
    training = _map(s.jobs, [(train_reuse_model, s, f, c, dirs[f]) for f, c in sizes], progress) if train else []
    calls = [(run_policy, s, f, c, p, dirs[f] if train else None) for f, c in sizes for p in s.policies]
    rows = _map(s.jobs, calls, progress)
    header = {
        "trace": s.trace,
        "duration_s": s.duration_s,
        "rate_scale": s.rate_scale,
        "seed": s.seed,
        "workers": s.workers,
        "router_policy": "cost_aware",
        "distinct_blocks": distinct,
        "requests": len(trace),
        "split_s": split_s(trace, s.train_fraction),
        "train_fraction": s.train_fraction,
        "rerank_interval_s": s.rerank_interval_s,
        "reuse_model": s.reuse_model,
        "capacity_note": "what-if capacity: kv_capacity_blocks = fraction × distinct blocks ÷ workers "
        "(4 × A100 with Llama-3-8B hold ~880 blocks of 512 tokens per worker)",
        "training": training,
        "wall_s": time.perf_counter() - started,
    }
    result = {**header, "results": rows, "cost_aware_vs_lru": _gains(rows), "headroom": headroom(rows)}
    write_json(out / "eviction.json", result)
    plot_eviction_study(rows, out / "eviction.png", f"{s.trace}, {s.workers} workers, rate scale {s.rate_scale:g}")
    write_study_md(out / "eviction.md", result)
    return {**result, "out": str(out)}


def _gains(rows: list[dict]) -> list[dict]:
    """Per cache size: cost_aware's prefill seconds saved and hit ratio relative to lru (e.g. +0.12 = 12 % more)."""
    by = {(r["policy"], r["cache_fraction"]): r for r in rows}
    gains = []
    for (policy, fraction), r in by.items():
        base = by.get(("lru", fraction))
        if policy == "cost_aware" and base and base["prefill_saved_s"] > 0:
            gains.append(
                {
                    "cache_fraction": fraction,
                    "prefill_saved_gain": r["prefill_saved_s"] / base["prefill_saved_s"] - 1,
                    "hit_ratio_gain": r["hit_ratio"] / base["hit_ratio"] - 1 if base["hit_ratio"] else math.nan,
                }
            )
    return gains


#: What the report says about ``clairvoyant`` above its headroom lines.
CLAIRVOYANT_NOTE = (
    "`clairvoyant` reads the trace's future: it knows when the next request carrying each idle block "
    "arrives, and keeps the blocks whose recompute is dearest per byte per second of waiting. No "
    "deployment can know that, so it is not a policy to run, but a reference for how much an online "
    "rule could still gain (not a strict bound: the next carrier may be routed elsewhere). Each line "
    "compares with the online policy other than `cost_aware` that saved the most prefill seconds; "
    "\"of the headroom\" is `cost_aware`'s gain over it divided by `clairvoyant`'s."
)


def headroom(rows: Sequence[dict]) -> list[dict]:
    """Per cache size with a ``clairvoyant`` row: how far the online policies are from the offline reference.

    ``best_other``: the online policy other than ``cost_aware`` that saved the most prefill seconds;
    ``cost_aware_gain`` and ``clairvoyant_gain``: (policy − best other) ÷ best other (e.g. +0.05 =
    5 % more); ``captured``: the share of that headroom ``cost_aware`` took, (cost_aware − best) ÷
    (clairvoyant − best), NaN where the headroom is under 1 % of the best other (a share of almost
    nothing reads as noise: −154 % of a 0.5 % headroom). Empty without a ``clairvoyant`` row.
    """
    out = []
    for fraction in sorted({r["cache_fraction"] for r in rows}):
        at = {r["policy"]: r["prefill_saved_s"] for r in rows if r["cache_fraction"] == fraction}
        others = {p: v for p, v in at.items() if p not in ("cost_aware", "clairvoyant")}
        if "clairvoyant" not in at or not others or max(others.values()) <= 0:
            continue
        best = max(others, key=others.get)
        row = {"cache_fraction": fraction, "best_other": best, "best_other_s": others[best]}
        row["clairvoyant_gain"] = at["clairvoyant"] / others[best] - 1
        if "cost_aware" in at:
            row["cost_aware_gain"] = at["cost_aware"] / others[best] - 1
            span = at["clairvoyant"] - others[best]
            row["captured"] = (at["cost_aware"] - others[best]) / span if span >= 0.01 * others[best] else math.nan
        out.append(row)
    return out


def study_table(rows: Sequence[dict]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the result table (by cache size, then policy)."""
    header = [
        "cache fraction",
        "blocks/worker",
        "policy",
        "hit ratio",
        "prefill saved (s)",
        "TTFT P50 (s)",
        "TTFT P99 (s)",
    ]
    body = [
        [
            f"{r['cache_fraction']:g}",
            str(r["kv_capacity_blocks"]),
            r["policy"],
            f"{r['hit_ratio']:.1%}",
            f"{r['prefill_saved_s']:.1f}",
            f"{r['ttft_p50_s']:.3f}",
            f"{r['ttft_p99_s']:.3f}",
        ]
        for r in sorted(rows, key=lambda r: r["cache_fraction"])
    ]
    return header, body


def _fitted(training: dict) -> str:
    """How ``cost_aware``'s P(reuse) came out of one training part, for the report."""
    if not training["classifier_fitted"]:
        return "no model fitted (no reuse, or one label class, in the training part): the recency prior stands in"
    if training.get("cure_params"):
        pis = "/".join(f"{pi:.2f}" for pi, _, _ in training["cure_params"])
        return f"cure model fitted, π per reused-share class {pis}"
    return "classifier fitted"


def headroom_lines(rows: list[dict]) -> str:
    """One line per cache size of :func:`headroom`, for the report and the terminal."""
    lines = []
    for h in rows:
        line = f"- cache {h['cache_fraction']:g}: clairvoyant saves {h['clairvoyant_gain']:+.1%} prefill seconds"
        line += " over the best other online policy"
        line += f" (`{h['best_other']}`, {h['best_other_s']:.1f} s)"
        if "cost_aware_gain" in h:
            line += f"; cost_aware {h['cost_aware_gain']:+.1%}"
            if math.isfinite(h["captured"]):
                line += f", {h['captured']:.0%} of the headroom (its gain ÷ clairvoyant's)"
        lines.append(line)
    return "\n".join(lines)


def write_study_md(path: Path, result: dict) -> None:
    """The Markdown report: set-up, the table, cost_aware vs lru, the headroom to clairvoyant, the reuse model."""
    header, body = study_table(result["results"])
    gains = "\n".join(
        f"- cache fraction {g['cache_fraction']:g}: prefill seconds saved {g['prefill_saved_gain']:+.1%}, "
        f"token hit ratio {g['hit_ratio_gain']:+.1%} (relative to lru's)"
        for g in result["cost_aware_vs_lru"]
    )
    training = "\n".join(
        f"- fraction {t['cache_fraction']:g}: H = {t['horizon_s']:.0f} s, {t['training_rows']} samples, "
        f"{t['positive_share']:.1%} reused within H; {_fitted(t)}"
        for t in result["training"]
    )
    text = "\n\n".join(
        [
            f"# kvcost eviction study — {result['trace']}",
            f"{result['requests']} requests, {result['distinct_blocks']} distinct blocks, {result['workers']} workers, "
            f"rate scale {result['rate_scale']:g}, seed {result['seed']}, "
            "router `cost_aware`. "
            f"{result['capacity_note']}. H and the reuse model come from arrivals before "
            f"{result['split_s']:.0f} s (replay time, `lru`); every policy is measured after it. "
            f"Re-rank interval {result['rerank_interval_s']:g} s; "
            f"cost_aware's P(reuse): `{result['reuse_model']}`.",
            markdown_table(header, body),
            "## cost_aware vs lru\n\n" + (gains or "(not run)"),
            "## Against the clairvoyant reference\n\n"
            + CLAIRVOYANT_NOTE
            + "\n\n"
            + (headroom_lines(result.get("headroom", [])) or "(not run)"),
            "## reuse model\n\n" + (training or "(not trained)"),
            "![eviction](eviction.png)",
        ]
    )
    path.write_text(text + "\n")
