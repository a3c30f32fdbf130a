"""The ``kvcost`` command line (DESIGN.md §9).

Every command prints a short table at the end, writes machine-readable JSON
next to a Markdown report and PNG plots, shows a progress bar on long work,
and exits with status 2 and a one-line reason on bad input.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kvcost.data.store import LogStore
from kvcost.data.traces import Trace, load_trace
from kvcost.models.hardware import MODELS
from kvcost.replay.config import ClusterConfig, parse_fleet, parse_slowdown
from kvcost.replay.experiment import CONFIGURATIONS, Configuration, configure, replay, run_experiment
from kvcost.replay.metrics import infinite_cache_hit_ratio, summarise
from kvcost.replay.outputs import (
    comparison_rows,
    log_replay,
    plot_queues,
    plot_ttft_cdf,
    write_report_md,
    write_summary_json,
)
from kvcost.serving.policies import ROUTER_POLICIES
from kvcost.serving.router import RouterSettings

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.splitlines()[0])
console = Console()

#: Default rate scale of the bundled conversation trace on 4 × A100 (Llama-3-8B): the
#: balanced, cache-off configuration runs at ~82 % utilisation (measured, see README).
DEFAULT_RATE_SCALE = 0.55

TraceOpt = Annotated[
    str, typer.Option(help="Bundled trace name (mooncake-conversation, azure-conv, azure-code) or a path.")
]
WorkersOpt = Annotated[int, typer.Option(min=1, help="Number of workers (ignored when --fleet is given).")]
FleetOpt = Annotated[str | None, typer.Option(help="GPU mix, e.g. 'a100:2,h100:2' (default: --workers × a100).")]
RateOpt = Annotated[float, typer.Option(help="Arrival times are divided by this (2 = twice the load).")]
StartOpt = Annotated[float, typer.Option(help="Start of the trace window, seconds of trace time.")]
DurationOpt = Annotated[float | None, typer.Option(help="Length of the trace window, seconds of trace time.")]
SeedOpt = Annotated[int, typer.Option(help="Seed of every random stream (arrival spread, jitter).")]
WarmupOpt = Annotated[float, typer.Option(help="Simulate but do not measure arrivals before this (warms the cache).")]
LagOpt = Annotated[float, typer.Option(help="Delay of KV events to the router's directory, seconds.")]
SlowOpt = Annotated[
    list[str] | None,
    typer.Option(help="Straggler WORKER:FACTOR\\[@T_S] (worker index, step-time factor, start time in s); repeatable."),
]
BudgetOpt = Annotated[int, typer.Option(help="Tokens per continuous-batching step.")]
JitterOpt = Annotated[float, typer.Option(help="σ of the log-normal per-step jitter (ground truth only).")]
SkipOpt = Annotated[bool, typer.Option(help="Skip malformed trace lines and report how many.")]
OutOpt = Annotated[Path | None, typer.Option(help="Output folder (default runs/<UTC timestamp>).")]
DbOpt = Annotated[Path, typer.Option(help="DuckDB log, appended to.")]
ModelOpt = Annotated[str, typer.Option(help=f"Model served by every worker: {', '.join(MODELS.names())}.")]
KvBlocksOpt = Annotated[int | None, typer.Option(help="KV blocks per worker (default: from GPU memory).")]
MemUtilOpt = Annotated[float, typer.Option(help="Share of GPU memory for weights + KV (vLLM default 0.9).")]


class CacheSwitch(StrEnum):
    """``--cache on|off``."""

    on = "on"
    off = "off"


@dataclass(frozen=True)
class _Setup:
    trace: Trace
    trace_arg: str
    config: ClusterConfig
    out: Path
    db: Path


def _fail(message: str) -> None:
    console.print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(code=2)


def _setup(
    trace,
    workers,
    fleet,
    rate_scale,
    start_s,
    duration_s,
    seed,
    warmup_s,
    directory_lag_s,
    slowdown,
    token_budget,
    jitter_sigma,
    skip_bad_lines,
    out,
    db,
) -> _Setup:
    try:
        loaded = load_trace(
            trace,
            start_s=start_s,
            duration_s=duration_s,
            rate_scale=rate_scale,
            spread_seed=seed,
            skip_bad_lines=skip_bad_lines,
        )
        config = ClusterConfig(
            fleet=parse_fleet(fleet, 0 if fleet else workers),
            token_budget=token_budget,
            directory_lag_s=directory_lag_s,
            jitter_sigma=jitter_sigma,
            slowdowns=tuple(parse_slowdown(s) for s in slowdown or ()),
            seed=seed,
            warmup_s=warmup_s,
        )
    except (ValueError, KeyError, FileNotFoundError) as exc:
        _fail(str(exc.args[0]) if exc.args else str(exc))
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return _Setup(loaded, trace, config, out or Path("runs") / stamp, db)


def _progress_run(total: int, body):
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("replaying", total=total)
        return body(lambda n: progress.advance(task, n))


def _setup_lines(s: _Setup, results) -> list[str]:
    t, c = s.trace, s.config
    spread = (
        f"arrivals spread uniformly (seed {c.seed}) inside the trace's {t.spread_bucket_s:.1f} s timestamp buckets"
        if t.spread_bucket_s
        else "arrivals as recorded (no bucket spread)"
    )
    window = f"{t.start_s:.0f} s + {t.duration_s:.0f} s" if t.duration_s else f"from {t.start_s:.0f} s to the end"
    cache = f"warmed by the first {c.warmup_s:.0f} s of arrivals (not measured)" if c.warmup_s else "cold"
    slow = ", ".join(f"worker {x.worker_id} × {x.factor} from {x.from_s:.0f} s" for x in c.slowdowns) or "none"
    return [
        f"trace `{s.trace_arg}` ({t.source}), {len(t)} requests, window {window}, skipped lines {t.skipped_lines}",
        f"rate scale {t.rate_scale} (arrival times divided by it); {spread}",
        f"model {c.model}; fleet {', '.join(c.fleet)}; token budget {c.token_budget} per step",
        f"initial cache state: {cache}; directory lag {c.directory_lag_s} s; token hit ratio bound with an "
        f"infinite shared cache {infinite_cache_hit_ratio(t):.1%}",
        f"ground truth beyond the router's model: per-step log-normal jitter σ={c.jitter_sigma}; stragglers: {slow}",
        f"seed {c.seed}; DuckDB log `{s.db}`; "
        + ", ".join(f"{k}: {v.requests.shape[0]} measured" for k, v in results.items()),
    ]


def _write_outputs(s: _Setup, arms: list[Configuration], summary: dict, results: dict) -> None:
    s.out.mkdir(parents=True, exist_ok=True)
    summary = {
        "trace": s.trace_arg,
        "workers": s.config.workers,
        "fleet": list(s.config.fleet),
        "rate_scale": s.trace.rate_scale,
        "seed": s.config.seed,
        "requests": len(s.trace),
        "hit_ratio_bound_infinite_cache": infinite_cache_hit_ratio(s.trace),
        "initial_cache_state": f"warm: first {s.config.warmup_s:g} s of arrivals" if s.config.warmup_s else "cold",
        **summary,
    }
    write_summary_json(s.out / "summary.json", summary)
    plot_ttft_cdf(results, s.out / "ttft_cdf.png")
    plot_queues(results, s.out / "queued_prefill_tokens.png")
    plots = ["ttft_cdf.png", "queued_prefill_tokens.png"]
    if "attribution" in summary:
        write_report_md(s.out / "report.md", summary, _setup_lines(s, results), plots)
    started = datetime.now(UTC)
    batch = uuid.uuid4().hex[:8]
    try:
        with LogStore(s.db).open() as store:
            for arm in arms:
                params = {
                    "config": asdict(configure(s.config, arm)),
                    "trace": s.trace_arg,
                    "start_s": s.trace.start_s,
                    "duration_s": s.trace.duration_s,
                    "rate_scale": s.trace.rate_scale,
                }
                log_replay(store, f"{batch}-{arm.name}", arm.name, s.trace_arg, params, started, results[arm.name])
    except ValueError as exc:
        _fail(str(exc))
    _print_table(summary, s.out)


def _print_table(summary: dict, out: Path) -> None:
    header, rows = comparison_rows(summary["configs"])
    table = Table(*header, title=f"kvcost — {summary['trace']}, {summary['workers']} workers")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    if "attribution" in summary:
        a = summary["attribution"]
        console.print(
            f"cache gain P50 {a['cache_gain_p50_s']:+.3f} s, P99 {a['cache_gain_p99_s']:+.3f} s; "
            f"routing gain P50 {a['routing_gain_p50_s']:+.3f} s, P99 {a['routing_gain_p99_s']:+.3f} s"
        )
    report = out / "report.md"
    console.print(f"report: {report if report.exists() else out / 'summary.json'}")


@app.command()
def experiment(
    trace: TraceOpt = "mooncake-conversation",
    workers: WorkersOpt = 4,
    fleet: FleetOpt = None,
    rate_scale: RateOpt = DEFAULT_RATE_SCALE,
    start_s: StartOpt = 0.0,
    duration_s: DurationOpt = None,
    seed: SeedOpt = 0,
    warmup_s: WarmupOpt = 0.0,
    directory_lag_s: LagOpt = 0.0,
    slowdown: SlowOpt = None,
    token_budget: BudgetOpt = 8192,
    model: ModelOpt = "llama-3-8b",
    kv_capacity_blocks: KvBlocksOpt = None,
    gpu_memory_utilization: MemUtilOpt = 0.9,
    jitter_sigma: JitterOpt = 0.05,
    skip_bad_lines: SkipOpt = False,
    out: OutOpt = None,
    db: DbOpt = Path("runs/kvcost.duckdb"),
) -> None:
    """Replay one trace under balanced_nocache, balanced_cache and cost_aware; attribute the gains."""
    s = _setup(
        trace,
        workers,
        fleet,
        rate_scale,
        start_s,
        duration_s,
        seed,
        warmup_s,
        directory_lag_s,
        slowdown,
        token_budget,
        jitter_sigma,
        skip_bad_lines,
        out,
        db,
    )
    summary, results = _progress_run(len(s.trace) * len(CONFIGURATIONS), lambda p: run_experiment(s.trace, s.config, p))
    _write_outputs(s, list(CONFIGURATIONS), summary, results)


@app.command("replay")
def replay_command(
    policy: Annotated[str, typer.Option(help=f"Router policy: {', '.join(ROUTER_POLICIES.names())}.")] = "cost_aware",
    cache: Annotated[CacheSwitch, typer.Option(help="Prefix cache on or off.")] = CacheSwitch.on,
    trace: TraceOpt = "mooncake-conversation",
    workers: WorkersOpt = 4,
    fleet: FleetOpt = None,
    rate_scale: RateOpt = DEFAULT_RATE_SCALE,
    start_s: StartOpt = 0.0,
    duration_s: DurationOpt = None,
    seed: SeedOpt = 0,
    warmup_s: WarmupOpt = 0.0,
    directory_lag_s: LagOpt = 0.0,
    slowdown: SlowOpt = None,
    token_budget: BudgetOpt = 8192,
    model: ModelOpt = "llama-3-8b",
    kv_capacity_blocks: KvBlocksOpt = None,
    gpu_memory_utilization: MemUtilOpt = 0.9,
    jitter_sigma: JitterOpt = 0.05,
    skip_bad_lines: SkipOpt = False,
    out: OutOpt = None,
    db: DbOpt = Path("runs/kvcost.duckdb"),
) -> None:
    """Replay one trace under one policy, cache on or off."""
    if policy not in ROUTER_POLICIES:
        _fail(f"policy = {policy!r}, expected one of {', '.join(ROUTER_POLICIES.names())}")
    s = _setup(
        trace,
        workers,
        fleet,
        rate_scale,
        start_s,
        duration_s,
        seed,
        warmup_s,
        directory_lag_s,
        slowdown,
        token_budget,
        jitter_sigma,
        skip_bad_lines,
        out,
        db,
    )
    arm = Configuration(
        f"{policy}_{'cache' if cache is CacheSwitch.on else 'nocache'}", policy, cache is CacheSwitch.on
    )
    result = _progress_run(len(s.trace), lambda p: replay(s.trace, configure(s.config, arm), p))
    summary = {"configs": {arm.name: summarise(result, s.config.workers)}}
    _write_outputs(s, [arm], summary, {arm.name: result})


def main() -> None:
    """Entry point for ``python -m kvcost.cli``."""
    app()


if __name__ == "__main__":
    main()

__all__ = ["RouterSettings", "app", "main"]
