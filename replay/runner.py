"""Run a replay study end to end: validate every input, open the log, replay, write every output.

The CLI is a thin shell over :func:`prepare` and :func:`execute`; both raise
``ValueError`` (or ``KeyError`` / ``FileNotFoundError`` from the loaders) with
a message naming the option, the value and what was expected, *before* any
simulation work or output is written.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import duckdb

from kvcost.core.plots import plot_hit_vs_p99, plot_p99_vs_load, plot_queues, plot_ttft_cdf
from kvcost.core.reporting import write_json
from kvcost.data.segments import roll_segments, segments_dir_for
from kvcost.data.store import LogStore, check_duckdb_file
from kvcost.data.traces import Trace, load_trace
from kvcost.models.mlflow_store import load_model_set
from kvcost.models.predictors import FeatureSpecMismatch
from kvcost.models.term_set import TermModelSet
from kvcost.models.training import prediction_block
from kvcost.replay.bench import (
    ANCHORS,
    BASELINES,
    CALIBRATED_TRACES,
    DEFAULT_HARDWARE,
    KVCOST_POLICIES,
    QUICK_DURATION_S,
    REFERENCE_POLICIES,
    TARGET_UTILISATION,
    BenchHardware,
    add_ratios,
    bench_cells,
    best_baseline,
    calibrate,
    rate_scales,
    run_bench,
)
from kvcost.replay.bench_report import (
    line_styles,
    marker_styles,
    policy_params_text,
    write_bench_json,
    write_bench_md,
)
from kvcost.replay.config import ClusterConfig, parse_fleet, parse_slowdown, profile_names
from kvcost.replay.experiment import CONFIGURATIONS, LEARNED_ARM, Configuration, configure, replay, study_summary
from kvcost.replay.metrics import infinite_cache_hit_ratio, p99_by_window, physical_limit_ttft_p99_s
from kvcost.replay.online import OnlineSettings
from kvcost.replay.outputs import log_replay, write_report_md
from kvcost.replay.simulator import ReplayResult
from kvcost.routing.policies import ROUTER_POLICIES
from kvcost.routing.router import RouterSettings

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunSpec:
    """A validated study: the loaded trace, the cluster, where outputs and the log go."""

    trace_arg: str
    trace: Trace
    config: ClusterConfig
    out: Path
    db: Path


def prepare(
    trace: str,
    *,
    workers: int,
    fleet: str | None,
    slowdowns: Sequence[str],
    start_s: float,
    duration_s: float | None,
    rate_scale: float,
    skip_bad_lines: bool,
    out: Path | None,
    db: Path,
    count_in_flight: bool = True,
    count_promise_survival: bool = True,
    max_share_over_mean: float = math.inf,
    policy_params: tuple[tuple[str, float], ...] = (),
    **cluster,
) -> RunSpec:
    """Load the trace and build the cluster configuration; check outputs can be written.

    Args:
        trace: bundled trace name or path.
        workers: worker count when ``fleet`` is None.
        fleet: GPU mix such as ``"a100:2,h100:2"``.
        slowdowns: ``WORKER:SPEED[@T_S]`` strings.
        start_s, duration_s: trace window, seconds of *trace* time.
        rate_scale: arrival times are divided by it.
        skip_bad_lines: skip malformed trace lines instead of failing.
        out: output folder (None: ``runs/<UTC timestamp>``).
        db: DuckDB log path.
        count_in_flight, count_promise_survival, max_share_over_mean, policy_params: the router's settings of
            the same names (:class:`~kvcost.routing.router.RouterSettings`), for every arm.
        **cluster: further :class:`ClusterConfig` fields (model, token_budget, seed, warmup_s ...).

    Raises:
        ValueError, KeyError, FileNotFoundError: bad input, with a message naming it.
    """
    loaded = load_trace(
        trace,
        start_s=start_s,
        duration_s=duration_s,
        rate_scale=rate_scale,
        spread_seed=cluster.get("seed", 0),
        skip_bad_lines=skip_bad_lines,
    )
    config = ClusterConfig(
        fleet=parse_fleet(fleet, 0 if fleet else workers, tuple(profile_names(cluster.get("profiles", ())))),
        slowdowns=tuple(parse_slowdown(s) for s in slowdowns),
        router=RouterSettings(
            count_in_flight=count_in_flight,
            count_promise_survival=count_promise_survival,
            max_share_over_mean=max_share_over_mean,
            policy_params=policy_params,
        ),
        **cluster,
    )
    config.check_hardware()
    last_arrival_s = loaded.requests[-1].arrival_s
    if config.warmup_s > last_arrival_s:
        raise ValueError(
            f"warmup_s = {config.warmup_s:g}, expected less than the last arrival ({last_arrival_s:.1f} s "
            "of replay time) so that some requests are measured"
        )
    try:
        check_duckdb_file(db)
    except duckdb.Error as exc:
        raise ValueError(f"db = {str(db)!r} cannot be opened: {exc}") from None
    out = out if out is not None else Path("runs") / datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    if out.exists() and not out.is_dir():
        raise ValueError(f"out = {str(out)!r} is a file, expected a folder (or a path that does not exist)")
    return RunSpec(trace, loaded, config, out, db)


@dataclass(frozen=True)
class LearnedSetup:
    """How the ``learned_cost_aware`` arm gets its models.

    Attributes:
        online: retrain inside the replay (None: use the MLflow champion).
        mlflow_uri: registry to load the champion from (None: the default under ``runs/``).
    """

    online: OnlineSettings | None = None
    mlflow_uri: str | None = None


def execute(
    spec: RunSpec,
    arms: Sequence[Configuration],
    progress: Callable[[int], None] | None = None,
    learned: LearnedSetup | None = None,
) -> dict:
    """Replay every arm, append the runs to the log, write ``summary.json``, ``report.md`` and plots.

    With ``learned``, the ``learned_cost_aware`` arm routes with the MLflow
    champion (or retrains online), and the summary gains a ``prediction`` block:
    LightGBM trained on the first 60 % of this study's logged requests, against
    the analytic model, on the last 40 %.

    The log is opened first (so a locked or foreign database fails before any
    simulation) and holds the lock until the rows are written. ``summary.json``
    depends only on the inputs (same seed, same bytes); the DuckDB run ids, which
    are unique per invocation, are listed in ``report.md``.

    Returns:
        The ``summary.json`` content.

    Raises:
        ValueError: the log cannot be opened or the output folder cannot be created.
    """
    cost_model, model_note = _learned_model(learned) if learned is not None else (None, None)
    online = learned.online if learned is not None else None
    with _open_store(spec.db) as store:
        _make_out(spec.out)
        results = {}
        for arm in arms:
            is_learned = ROUTER_POLICIES.get(arm.policy).learned
            config = configure(spec.config, arm)
            results[arm.name] = replay(
                spec.trace, config, progress, cost_model if is_learned else None, online if is_learned else None
            )
        run_ids = _log_runs(store, spec, arms, results)
    summary = {**_study_header(spec), **study_summary(results, spec.config.workers)}
    if learned is not None:
        summary["learned_model"] = model_note
        summary["prediction"] = prediction_block(spec.db, list(run_ids.values()))
    if online is not None and "online" in summary:
        summary["online"]["p99_by_window"] = p99_by_window(results, online.retrain_every_s)
    _write_files(spec, summary, results, run_ids)
    return summary


def _learned_model(learned: LearnedSetup) -> tuple[TermModelSet | None, str]:
    """The champion (or None for online learning / fallback) and a sentence saying which."""
    if learned.online is not None:
        return None, f"online: analytic at start, LightGBM retrained every {learned.online.retrain_every_s:g} s"
    try:
        model_set = load_model_set(learned.mlflow_uri)
    except (LookupError, FeatureSpecMismatch) as exc:
        _log.warning("learned_cost_aware falls back to the analytic model: %s", exc)
        return None, f"fallback to analytic: {str(exc).splitlines()[0]}"
    meta = model_set.metadata
    return model_set, f"MLflow champion: {meta.get('predictor')} terms trained on {meta.get('rows')} rows"


def experiment_arms(learned: bool = False, eviction_policy: str = "lru") -> list[Configuration]:
    """The configurations of the experiment (docs/architecture.md §4), plus ``learned_cost_aware`` if asked.

    An arm that only changes the workers' eviction policy to ``eviction_policy``, the run's own, would
    repeat ``cost_aware``: it is left out.
    """
    arms = [arm for arm in CONFIGURATIONS if arm.eviction_policy != eviction_policy]
    return [*arms, LEARNED_ARM] if learned else arms


def _open_store(db: Path) -> LogStore:
    try:
        return LogStore(db).open()
    except (duckdb.Error, OSError) as exc:
        raise ValueError(f"db = {str(db)!r} cannot be opened: {str(exc).splitlines()[0]}") from None


def _make_out(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"out = {str(out)!r} cannot be created: {exc.strerror}") from None


def _log_runs(store: LogStore, spec: RunSpec, arms: Sequence[Configuration], results: dict) -> dict[str, str]:
    """Append one run per arm to the log (run ids ``<batch>-<arm>``), roll the segments; returns arm → run id."""
    started = datetime.now(UTC)
    batch = uuid.uuid4().hex[:8]
    run_ids = {arm.name: f"{batch}-{arm.name}" for arm in arms}
    for arm in arms:
        params = {**_study_header(spec), "config": asdict(configure(spec.config, arm)), "out": str(spec.out)}
        log_replay(store, run_ids[arm.name], arm.name, spec.trace_arg, params, started, results[arm.name])
    roll_segments(store, segments_dir_for(spec.db))
    return run_ids


def _study_header(spec: RunSpec) -> dict:
    t, c = spec.trace, spec.config
    return {
        "trace": spec.trace_arg,
        "workers": c.workers,
        "fleet": list(c.fleet),
        "model": c.model,
        "rate_scale": t.rate_scale,
        "start_s": t.start_s,
        "duration_s": t.duration_s,
        "seed": c.seed,
        "requests": len(t),
        "skipped_lines": t.skipped_lines,
        "spread_bucket_s": t.spread_bucket_s,
        "hit_ratio_bound_infinite_cache": infinite_cache_hit_ratio(t),
        "initial_cache_state": f"warm: first {c.warmup_s:g} s of replay time" if c.warmup_s else "cold",
        "directory_lag_s": c.directory_lag_s,
        "eviction_policy": c.eviction_policy,
    }


def _write_files(spec: RunSpec, summary: dict, results: dict[str, ReplayResult], run_ids: dict[str, str]) -> None:
    caption = f"{spec.trace_arg}, rate scale {spec.trace.rate_scale:g}, {spec.config.workers} workers"
    write_json(spec.out / "summary.json", summary)
    plot_ttft_cdf(
        {k: r.requests["actual_ttft_s"].to_numpy() for k, r in results.items()}, spec.out / "ttft_cdf.png", caption
    )
    plot_queues({k: r.worker_samples for k, r in results.items()}, spec.out / "queued_prefill_tokens.png", caption)
    plots = ["ttft_cdf.png", "queued_prefill_tokens.png"]
    limit_s = physical_limit_ttft_p99_s(spec.trace, spec.config)
    write_json(spec.out / "physical_limit.json", _physical_limit_block(spec, limit_s))
    lines = _setup_lines(spec, results, run_ids, summary["hit_ratio_bound_infinite_cache"])
    lines.append(
        f"physical limit: TTFT P99 {limit_s:.3f} s with isolated prefill, an infinite shared cache and no queue "
        "(`physical_limit.json`)"
    )
    write_report_md(spec.out / "report.md", summary, lines, plots)


def _physical_limit_block(spec: RunSpec, limit_s: float) -> dict:
    """``physical_limit.json``: kept out of ``summary.json``, whose bytes stay as they were."""
    c = spec.config
    return {
        "trace": spec.trace_arg,
        "requests": len(spec.trace),
        "model": c.model,
        "fleet": list(c.fleet),
        "token_budget": c.token_budget,
        "physical_limit_ttft_p99_s": limit_s,
        "definition": "TTFT P99 of each request's prefill alone on the fleet's fastest GPU type, its prefix "
        "served by one infinite shared cache, no queue (lookup + prefill + first-token work, no jitter)",
    }


def _setup_lines(
    spec: RunSpec, results: dict[str, ReplayResult], run_ids: dict[str, str], hit_ratio_bound: float
) -> list[str]:
    t, c = spec.trace, spec.config
    spread = (
        f"arrivals spread uniformly (seed {c.seed}) inside the trace's {t.spread_bucket_s:.1f} s timestamp buckets"
        if t.spread_bucket_s
        else "arrivals as recorded (no bucket spread)"
    )
    window = f"{t.start_s:g} s + {t.duration_s:g} s" if t.duration_s else f"from {t.start_s:g} s to the end"
    cache = f"warmed by arrivals before {c.warmup_s:g} s of replay time (not measured)" if c.warmup_s else "cold"
    slow = ", ".join(f"worker {x.worker_id} at {x.speed_fraction:.0%} speed from {x.from_s:g} s" for x in c.slowdowns)
    slow = slow or "none"
    measured = ", ".join(f"{k}: {v.requests.shape[0]} measured (run `{run_ids[k]}`)" for k, v in results.items())
    return [
        f"trace `{spec.trace_arg}`: {len(t)} requests in the window {window} of trace time; "
        f"{t.skipped_lines} malformed lines skipped",
        f"rate scale {t.rate_scale:g} (arrival times divided by it); {spread}",
        f"model {c.model}; fleet {', '.join(c.fleet)}; token budget {c.token_budget} per step",
        f"initial cache state: {cache}; eviction policy `{c.eviction_policy}` (each arm's: the table's row); "
        f"directory lag {c.directory_lag_s:g} s; token hit ratio bound with an infinite shared cache "
        f"{hit_ratio_bound:.1%}",
        f"ground truth beyond the router's model: per-step log-normal jitter σ={c.jitter_sigma:g}; stragglers: {slow}",
        _router_line(c.router),
        f"seed {c.seed}; DuckDB log `{spec.db}`; {measured}",
    ]


def _router_line(router: RouterSettings) -> str:
    """The set-up line of the router's toggles (``kvcost replay --no-count-in-flight`` and the like)."""
    skew = "off" if math.isinf(router.max_share_over_mean) else f"{router.max_share_over_mean:g} over the mean share"
    return (
        f"router (cost-aware arms): in-flight prefixes counted: {'yes' if router.count_in_flight else 'no'}; "
        f"queued work net of the reuse expected to survive: {'yes' if router.count_promise_survival else 'no'}; "
        f"hot-spot skew limit: {skew}; policy parameters: {policy_params_text(router.policy_params) or 'defaults'}"
    )


def bench_policies(requested: Sequence[str] | None) -> list[str]:
    """Policies to benchmark: ``requested`` (validated), or every registered baseline, anchor, kvcost and reference
    policy.

    Raises:
        ValueError: a requested name is not a registered policy (``policies = '…': unknown router policy …``),
            or ``requested`` names none.
    """
    if requested is not None and not [name for name in requested if name]:
        raise ValueError("policies = '', expected comma-separated router policies (or no --policies for all)")
    if requested:
        for name in requested:
            try:
                ROUTER_POLICIES.get(name)
            except KeyError as exc:
                raise ValueError(f"policies = {','.join(requested)!r}: {exc.args[0]}") from None
        return list(requested)
    names = [*REFERENCE_POLICIES[:2], *BASELINES, *ANCHORS, *KVCOST_POLICIES, REFERENCE_POLICIES[2]]
    return [name for name in names if name in ROUTER_POLICIES]


def execute_bench(
    trace: str,
    *,
    sizes: Sequence[int],
    policies: Sequence[str],
    quick: bool,
    seed: int,
    jobs: int,
    out: Path | None,
    progress: Callable[[int], None] | None = None,
    calibrate_levels: bool | None = None,
    given_scales: dict[int, dict[str, float]] | None = None,
    replays: int = 1,
    eviction_policy: str = "lru",
    hardware: BenchHardware = DEFAULT_HARDWARE,
    policy_params: tuple[tuple[str, float], ...] = (),
) -> dict:
    """Run the benchmark grid and write ``bench.json``, ``bench.md`` and plots into ``out``.

    Every cell's workers, and the calibration's, evict by ``eviction_policy`` and are ``hardware``
    (GPU, model, tensor-parallel degree); the header records both. Every benched policy routes with
    ``policy_params`` (``RouterSettings.policy_params``; each policy must take them), the calibration's
    ``least_loaded`` with none; the header records them.

    Each cell is replayed ``replays`` times at nearby rate scales and reported by its median-P99
    replay (:func:`kvcost.replay.bench.run_cell`); the header records ``replays``.

    Load levels: with ``calibrate_levels`` (default: every trace but those of
    ``CALIBRATED_TRACES`` on the default hardware) the rate scales are found by bisection per cluster
    size (``kvcost.replay.bench.calibrate``); else the constants of
    ``rate_scales``. ``given_scales`` (workers → load label → rate scale, every size
    present; e.g. a previous run's calibration, :func:`parse_rate_scales`) skips both.
    The header carries the workload's physical limit (TTFT P99 of isolated prefill,
    infinite shared cache, no queue) and the calibration.

    Raises:
        ValueError / KeyError: unknown policy or trace, bad size, ``replays`` < 1, unwritable output.
    """
    if replays < 1:
        raise ValueError(f"replays = {replays}, expected an integer ≥ 1")
    for workers in sizes:
        if workers < 1:
            raise ValueError(f"sizes contains {workers}, expected worker counts ≥ 1")
    duration_s = QUICK_DURATION_S if quick else None
    loaded = load_trace(trace, duration_s=duration_s, spread_seed=seed)  # fail fast on a bad trace
    out = out if out is not None else Path("runs") / f"bench-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"
    _make_out(out)
    if calibrate_levels is None:
        constants = trace in CALIBRATED_TRACES and hardware == DEFAULT_HARDWARE
        calibrate_levels = not constants and given_scales is None
    found = calibrate(trace, sizes, duration_s, seed, jobs, eviction_policy, hardware) if calibrate_levels else None
    scales = {w: {k: c.rate_scale for k, c in found[w].items()} for w in sizes} if found else given_scales
    cells = bench_cells(policies, sizes, scales, eviction_policy, hardware, policy_params)
    queue_cell = (min(sizes), "80%")
    rows = run_bench(
        cells, trace, duration_s, seed, jobs, lambda c: (c.workers, c.load) == queue_cell, progress, replays
    )
    add_ratios(rows)
    window = f"first {QUICK_DURATION_S:g} s of trace time" if quick else "whole trace"
    header = {
        "trace": trace,
        "seed": seed,
        "quick": quick,
        "replays": replays,
        "eviction_policy": eviction_policy,
        "hardware": asdict(hardware),
        "policy_params": dict(policy_params),
        "window": window,
        "sizes": list(sizes),
        "load_levels": {str(w): scales[w] if scales else rate_scales(w) for w in sizes},
        "requests": len(loaded),
        "physical_limit_ttft_p99_s": physical_limit_ttft_p99_s(loaded, hardware.cluster(1)),
        "calibration": [asdict(c) for w in sizes for c in found[w].values()] if found else _scales_source(given_scales),
    }
    plots = ["p99_vs_load.png", "hit_ratio_vs_p99.png", "worker_queues.png"]
    write_bench_json(out / "bench.json", header, rows)
    plot_p99_vs_load(rows, out / plots[0], line_styles(rows))
    plot_hit_vs_p99(rows, out / plots[1], marker_styles(rows))
    _plot_bench_queues(rows, queue_cell, out / plots[2])
    write_bench_md(out / "bench.md", header, rows, plots)
    return {**header, "out": str(out), "results": rows}


def _scales_source(given_scales: dict | None) -> str:
    return "given (--rate-scales)" if given_scales else "constants (rate_scales)"


def parse_rate_scales(text: str, sizes: Sequence[int]) -> dict[int, dict[str, float]]:
    """``"4=0.55,0.71,1;8=0.92,1.19,2"`` → ``{4: {"60%": 0.55, "80%": 0.71, "95%": 1.0}, 8: {...}}``.

    One entry per cluster size in ``sizes``, each with one rate scale (> 0) per load level of
    :data:`~kvcost.replay.bench.TARGET_UTILISATION`, in its order (60 %, 80 %, 95 %).

    Raises:
        ValueError: a malformed entry, a scale ≤ 0, a wrong count, or a size without an entry.
    """
    labels = list(TARGET_UTILISATION)
    expected = f"'WORKERS=' and {len(labels)} rate scales > 0 ({', '.join(labels)}), e.g. '4=0.55,0.71,1;8=0.92,1.19,2'"
    scales: dict[int, dict[str, float]] = {}
    for entry in filter(None, (e.strip() for e in text.split(";"))):
        workers, _, values = entry.partition("=")
        try:
            numbers = [float(v) for v in values.split(",")]
            size = int(workers)
        except ValueError:
            raise ValueError(f"rate_scales entry {entry!r}, expected {expected}") from None
        if len(numbers) != len(labels) or not all(x > 0 for x in numbers):
            raise ValueError(f"rate_scales entry {entry!r}, expected {expected}")
        scales[size] = dict(zip(labels, numbers, strict=True))
    missing = [w for w in sizes if w not in scales]
    if missing:
        raise ValueError(f"rate_scales = {text!r} has no entry for sizes {missing}, expected {expected}")
    return {w: scales[w] for w in sizes}


def _plot_bench_queues(rows: list[dict], cell: tuple[int, str], path: Path) -> None:
    """Worker queues of ``cell``: the best anchor's and kvcost's policies', or, where none of those
    ran (``--policies least_loaded,oracle``), every policy's."""
    workers, load = cell
    base = best_baseline(rows, workers, load)
    wanted = [name for name in (base, *KVCOST_POLICIES) if name]
    in_cell = [r for r in rows if r["workers"] == workers and r["load"] == load]
    chosen = [r for r in in_cell if r["policy"] in wanted]
    caption = "best baseline vs kvcost" if chosen else "every policy"
    samples = {r["policy"]: r["worker_samples"] for r in chosen or in_cell}
    plot_queues(samples, path, f"{workers} workers, {load} load ({caption})")
