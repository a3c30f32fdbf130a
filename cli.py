"""kvcost: a TTFT cost model for cache-aware LLM routing; trace-replay experiments.

Every command prints a short table at the end, writes machine-readable JSON
next to a Markdown report and PNG plots, shows a progress bar on long work,
and exits with status 2 and a one-line reason on bad input.

Two clocks: ``--start-s`` and ``--duration-s`` select a window in *trace*
time; everything after loading (``--warmup-s``, ``--slowdown …@T_S``, plots,
the log's ``arrival_s``) is *replay* time, i.e. trace time ÷ ``--rate-scale``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kvcost.core.hardware import MODELS
from kvcost.data.traces import BUNDLED_TRACES, TraceFormatError
from kvcost.data.workloads import write_workload
from kvcost.replay.experiment import Configuration
from kvcost.replay.online import OnlineSettings
from kvcost.replay.outputs import comparison_rows
from kvcost.replay.runner import (
    LearnedSetup,
    RunSpec,
    bench_policies,
    execute,
    execute_bench,
    experiment_arms,
    prepare,
)
from kvcost.routing.policies import ROUTER_POLICIES

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.splitlines()[0])
console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)

#: Default rate scale of the bundled conversation trace on 4 × A100 (Llama-3-8B): the
#: balanced, cache-off configuration runs at ~81 % utilisation (measured, see README).
DEFAULT_RATE_SCALE = 0.55

TraceOpt = Annotated[str, typer.Option(help=f"Bundled trace ({', '.join(BUNDLED_TRACES)}), gen:<shape> or a path.")]
WorkersOpt = Annotated[int, typer.Option(min=1, help="Number of workers (ignored when --fleet is given).")]
FleetOpt = Annotated[str | None, typer.Option(help="GPU mix, e.g. 'a100:2,h100:2' (default: --workers × a100).")]
RateOpt = Annotated[float, typer.Option(help="Arrival times are divided by this (2 = twice the load).")]
StartOpt = Annotated[float, typer.Option(help="Start of the trace window, seconds of trace time.")]
DurationOpt = Annotated[float | None, typer.Option(help="Length of the trace window, seconds of trace time.")]
SeedOpt = Annotated[int, typer.Option(help="Seed of every random stream (arrival spread, jitter).")]
WarmupOpt = Annotated[float, typer.Option(help="Simulate but do not measure arrivals before this, replay time s.")]
LagOpt = Annotated[float, typer.Option(help="Delay of KV events to the router's directory, seconds.")]
SlowOpt = Annotated[
    list[str] | None,
    typer.Option(help="Straggler WORKER:SPEED\\[@T_S]: runs at SPEED × nominal (0.6 = 60 %) from replay time T_S."),
]
BudgetOpt = Annotated[int, typer.Option(min=1, help="Tokens per continuous-batching step.")]
ModelOpt = Annotated[str, typer.Option(help=f"Model served by every worker: {', '.join(MODELS.names())}.")]
KvBlocksOpt = Annotated[int | None, typer.Option(min=1, help="KV blocks per worker (default: from GPU memory).")]
MemUtilOpt = Annotated[float, typer.Option(help="Share of GPU memory for weights + KV (vLLM default 0.9).")]
JitterOpt = Annotated[float, typer.Option(help="σ of the log-normal per-step jitter (ground truth only).")]
SkipOpt = Annotated[bool, typer.Option(help="Skip malformed trace lines and report how many.")]
OutOpt = Annotated[Path | None, typer.Option(help="Output folder (default runs/<UTC timestamp>).")]
DbOpt = Annotated[Path, typer.Option(help="DuckDB log, appended to.")]


class CacheSwitch(StrEnum):
    """``--cache on|off``."""

    on = "on"
    off = "off"


def _guard(body: Callable[[], object]) -> object:
    """Run ``body``; bad input becomes ``error: <reason>`` on stderr and exit status 2."""
    try:
        return body()
    except (ValueError, KeyError, FileNotFoundError, TraceFormatError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        err_console.print(f"[red]error:[/red] {_option_names(message)}", highlight=False, markup=True)
        raise typer.Exit(code=2) from None


#: Settings fields whose CLI option has another name (``ServiceSettings`` → ``kvcost serve``).
_FIELD_OPTIONS: dict[str, str] = {
    "hash_algorithm": "prefix_caching_hash_algo",
    "gpu_default": "gpu",
    "db_path": "db",
}


def _option_names(message: str) -> str:
    """``rate_scale = -1.0, …`` → ``--rate-scale = -1.0, …`` when the field is one of the CLI's options."""
    field_name = message.split(" ", 1)[0].rstrip(":")
    option = _FIELD_OPTIONS.get(field_name, field_name)
    if option not in _cli_parameters():
        return message
    return "--" + option.replace("_", "-") + message[len(field_name) :]


def _cli_parameters() -> set[str]:
    """Parameter names of every command of :data:`app` (and its sub-apps)."""
    typers, names = [app], set()
    while typers:
        current = typers.pop()
        for command in current.registered_commands:
            names |= set(inspect.signature(command.callback).parameters)
        typers += [group.typer_instance for group in current.registered_groups]
    return names


def _run(spec: RunSpec, arms: list[Configuration], learned: LearnedSetup | None = None) -> None:
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("replaying", total=len(spec.trace) * len(arms))
        summary = _guard(lambda: execute(spec, arms, lambda n: progress.advance(task, n), learned))
    _print_summary(summary, spec.out)


def _print_summary(summary: dict, out: Path) -> None:
    header, rows = comparison_rows(summary["configs"])
    table = Table(*header, title=f"kvcost — {summary['trace']}, {summary['workers']} workers")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    if summary["skipped_lines"]:
        console.print(f"skipped {summary['skipped_lines']} malformed trace line(s)")
    if "attribution" in summary:
        a = summary["attribution"]
        console.print(
            f"cache gain P50 {a['cache_gain_p50_s']:+.3f} s, P99 {a['cache_gain_p99_s']:+.3f} s; "
            f"routing gain P50 {a['routing_gain_p50_s']:+.3f} s, P99 {a['routing_gain_p99_s']:+.3f} s"
            + (
                f"; tier gain P50 {a['tier_gain_p50_s']:+.3f} s, P99 {a['tier_gain_p99_s']:+.3f} s"
                if "tier_gain_p99_s" in a
                else ""
            )
        )
    if "prediction" in summary:
        p = summary["prediction"]
        kinds = list(p["mae_s"])
        console.print(
            "holdout TTFT MAE: "
            + ", ".join(f"{k} {p['mae_s'][k]['ttft']:.3f} s" for k in kinds)
            + f"; 90 % coverage {p['coverage_90']:.1%}"
        )
    if "learned_model" in summary:
        console.print(f"learned_cost_aware: {summary['learned_model']}")
    console.print(f"report: {out / 'report.md'}")


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
    learned: Annotated[
        bool, typer.Option(help="Add learned_cost_aware, routing with the MLflow champion's calibrated models.")
    ] = False,
    online: Annotated[bool, typer.Option(help="learned_cost_aware retrains inside the replay instead.")] = False,
    retrain_every_s: Annotated[float, typer.Option(help="Online retraining period, replay seconds.")] = 300.0,
    mlflow_uri: Annotated[str | None, typer.Option(help="MLflow tracking URI of the champion.")] = None,
) -> None:
    """Replay one trace under balanced_nocache, balanced_cache, cost_aware, cost_aware_tiered; attribute the gains."""
    options = {k: v for k, v in locals().items() if k not in ("learned", "online", "retrain_every_s", "mlflow_uri")}
    spec = _guard(lambda: _prepare(options))
    setup = None
    if learned or online:
        settings = _guard(lambda: OnlineSettings(retrain_every_s=retrain_every_s)) if online else None
        setup = LearnedSetup(online=settings, mlflow_uri=mlflow_uri)
    _run(spec, experiment_arms(learned=setup is not None), setup)


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
    options = {k: v for k, v in locals().items() if k not in ("policy", "cache")}

    def check_policy() -> None:
        if policy not in ROUTER_POLICIES:
            raise ValueError(f"policy = {policy!r}, expected one of {', '.join(ROUTER_POLICIES.names())}")

    _guard(check_policy)
    spec = _guard(lambda: _prepare(options))
    enabled = cache is CacheSwitch.on
    _run(spec, [Configuration(f"{policy}_{'cache' if enabled else 'nocache'}", policy, enabled)])


@app.command()
def bench(
    trace: TraceOpt = "mooncake-conversation",
    quick: Annotated[bool, typer.Option(help="Replay only the first 120 s of trace time (CI smoke run).")] = False,
    sizes: Annotated[str, typer.Option(help="Cluster sizes, comma-separated worker counts.")] = "4,8",
    policies: Annotated[str | None, typer.Option(help="Comma-separated policies (default: all).")] = None,
    seed: SeedOpt = 0,
    jobs: Annotated[int, typer.Option(min=1, help="Parallel processes.")] = 2,
    out: OutOpt = None,
) -> None:
    """Every policy at ~60/80/95 % utilisation on 4 and 8 workers: bench.json, bench.md, plots."""

    def parse() -> tuple[list[int], list[str]]:
        try:
            size_list = [int(x) for x in sizes.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"sizes = {sizes!r}, expected comma-separated integers such as '4,8'") from None
        return size_list, bench_policies([p.strip() for p in policies.split(",")] if policies else None)

    size_list, names = _guard(parse)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    total = len(size_list) * 3 * len(names)
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("bench cells", total=total)
        result = _guard(
            lambda: execute_bench(
                trace,
                sizes=size_list,
                policies=names,
                quick=quick,
                seed=seed,
                jobs=jobs,
                out=out,
                progress=lambda n: progress.advance(task, n),
            )
        )
    _print_bench(result)


def _print_bench(result: dict) -> None:
    table = Table(
        "workers",
        "load",
        "policy",
        "TTFT P99 (s)",
        "× best baseline",
        "× oracle",
        "hit ratio",
        title=f"kvcost bench — {result['trace']} ({result['window']})",
    )
    for r in sorted(result["results"], key=lambda r: (r["workers"], r["load"], r["ttft_p99_s"])):
        table.add_row(
            str(r["workers"]),
            r["load"],
            r["policy"],
            f"{r['ttft_p99_s']:.2f}",
            f"{r['p99_vs_best_baseline']:.2f}",
            f"{r['p99_vs_oracle']:.2f}",
            f"{r['hit_ratio']:.1%}",
        )
    console.print(table)
    console.print(f"report: {Path(result['out']) / 'bench.md'}")


@app.command("eviction-study")
def eviction_study(
    trace: TraceOpt = "mooncake-conversation",
    duration_s: DurationOpt = None,
    fractions: Annotated[str, typer.Option(help="Cache sizes: fractions of the trace's distinct blocks.")] = (
        "0.05,0.1,0.25,0.5"
    ),
    policies: Annotated[str | None, typer.Option(help="Comma-separated eviction policies (default: all).")] = None,
    rate_scale: RateOpt = 0.55,
    seed: SeedOpt = 0,
    horizon_s: Annotated[
        float | None, typer.Option(help="cost_aware's reuse horizon H, s (default: measured on the training log).")
    ] = None,
    reuse_model: Annotated[
        str, typer.Option(help="cost_aware's P(reuse): cure (default), prior or lightgbm.")
    ] = "cure",
    jobs: Annotated[int, typer.Option(min=1, help="Parallel processes.")] = 2,
    out: OutOpt = None,
) -> None:
    """Every eviction policy at several what-if cache sizes: eviction.json, eviction.md, eviction.png."""
    from kvcost.replay.eviction_study import STUDY_POLICIES, StudySettings, check_settings, run_study, study_table

    def parse() -> StudySettings:
        try:
            sizes = tuple(float(x) for x in fractions.split(",") if x.strip())
        except ValueError:
            raise ValueError(f"fractions = {fractions!r}, expected comma-separated numbers such as 0.05,0.1") from None
        names = tuple(p.strip() for p in policies.split(",") if p.strip()) if policies else STUDY_POLICIES
        settings = StudySettings(
            trace=trace,
            duration_s=duration_s,
            fractions=sizes,
            policies=names,
            rate_scale=rate_scale,
            seed=seed,
            horizon_s=horizon_s,
            reuse_model=reuse_model,
            jobs=jobs,
        )
        check_settings(settings)
        return settings

    settings = _guard(parse)
    folder = out if out is not None else Path("runs") / f"eviction-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    total = len(settings.fractions) * (len(settings.policies) + ("cost_aware" in settings.policies))
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("eviction study runs", total=total)
        result = _guard(lambda: run_study(settings, folder, lambda n: progress.advance(task, n)))
    header, rows = study_table(result["results"])
    table = Table(*header, title=f"kvcost eviction study — {result['trace']} ({result['distinct_blocks']} blocks)")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for gain in result["cost_aware_vs_lru"]:
        console.print(
            f"cache {gain['cache_fraction']:g}: cost_aware saves "
            f"{gain['prefill_saved_gain']:+.1%} prefill seconds vs lru"
        )
    console.print(f"report: {folder / 'eviction.md'} ({result['wall_s']:.0f} s)")


MlflowOpt = Annotated[
    str | None,
    typer.Option(
        help="MLflow tracking URI (default sqlite:///runs/mlflow.db; a SQLite store keeps its artifacts in "
        "mlartifacts/ beside it)."
    ),
]


@app.command()
def train(
    db: DbOpt = Path("runs/kvcost.duckdb"),
    runs: Annotated[str | None, typer.Option(help="Comma-separated run ids (default: every run in the log).")] = None,
    predictor: Annotated[str, typer.Option(help="Term predictor: lightgbm, sklearn or analytic.")] = "lightgbm",
    mlflow_uri: MlflowOpt = None,
    out: OutOpt = None,
) -> None:
    """Train every TTFT term from the log, compare with the analytic model, register a challenger in MLflow."""
    from kvcost.models.train_job import METRIC_HEADER, metric_rows, run_training

    run_ids = [r.strip() for r in runs.split(",") if r.strip()] if runs else None
    with console.status("training"):
        outcome = _guard(lambda: run_training(db, run_ids=run_ids, predictor=predictor, mlflow_uri=mlflow_uri, out=out))
    table = Table(*METRIC_HEADER, title=f"kvcost train — holdout of {outcome.evaluation['rows']} requests")
    for row in metric_rows(outcome.evaluation):
        table.add_row(*row)
    console.print(table)
    console.print(
        f"coverage of the 90 % TTFT bound: {outcome.evaluation['coverage_90']:.1%}; "
        f"registered kvcost-terms version {outcome.version} as challenger"
    )
    console.print(f"report: {Path(outcome.report['out']) / 'training.md'}")


@app.command()
def retrain(
    every_s: Annotated[float, typer.Option(help="Seconds between retraining rounds (wall clock).")],
    db: DbOpt = Path("runs/kvcost.duckdb"),
    iterations: Annotated[
        int | None, typer.Option(min=1, help="Stop after this many rounds (default: run on).")
    ] = None,
    mlflow_uri: MlflowOpt = None,
) -> None:
    """Scheduled retraining: every S seconds train on the log, register a challenger, promote through the gate.

    ``--db`` is the DuckDB log, or — while another process writes it — the folder of
    closed Parquet segments its writer rolls (``runs/kvcost-segments`` for ``runs/kvcost.duckdb``).
    """
    from kvcost.models.train_job import retrain_loop

    history = _guard(
        lambda: retrain_loop(db, every_s=every_s, iterations=iterations, mlflow_uri=mlflow_uri, report=console.print)
    )
    promoted = sum(r["promoted"] for r in history)
    console.print(f"{len(history)} round(s), {promoted} promotion(s)")


models_app = typer.Typer(no_args_is_help=True, help="Review the kvcost-terms versions in the MLflow registry.")
app.add_typer(models_app, name="models")


@models_app.command("list")
def models_list(mlflow_uri: MlflowOpt = None) -> None:
    """Versions, aliases and holdout metrics of kvcost-terms."""
    from kvcost.models.mlflow_store import list_versions

    rows = _guard(lambda: list_versions(mlflow_uri))
    table = Table("version", "aliases", "TTFT MAE (s)", "analytic MAE (s)", "coverage 90", "feature spec", "run")
    for r in rows:
        table.add_row(
            str(r["version"]),
            ", ".join(r["aliases"]),
            _fmt(r["ttft_mae_s"], "{:.4f}"),
            _fmt(r["analytic_ttft_mae_s"], "{:.4f}"),
            _fmt(r["coverage_90"], "{:.1%}"),
            r["feature_spec_hash"] or "",
            r["run_id"][:12],
        )
    console.print(table if rows else "no kvcost-terms versions yet: run `kvcost train`")


@models_app.command("promote")
def models_promote(
    version: Annotated[str | None, typer.Option(help="Version to promote (default: the challenger).")] = None,
    force: Annotated[bool, typer.Option(help="Promote even if worse (needs --reason).")] = False,
    reason: Annotated[str, typer.Option(help="Why a forced promotion is justified; recorded.")] = "",
    mlflow_uri: MlflowOpt = None,
) -> None:
    """Move the champion alias to a version if, on the same holdout, it is no worse than the champion."""
    from kvcost.models.mlflow_store import promote

    def run():
        try:
            return promote(mlflow_uri, version, force, reason)
        except LookupError as exc:
            raise ValueError(str(exc)) from None

    result = _guard(run)
    table = Table("", "TTFT MAE (s)", "coverage 90", "|coverage − 0.9|", title=result.message)
    for name, figures in (("challenger", result.challenger), ("champion", result.champion)):
        if figures:
            table.add_row(
                name,
                f"{figures['ttft_mae_s']:.4f}",
                f"{figures['coverage_90']:.1%}",
                f"{figures['coverage_error']:.3f}",
            )
    console.print(table)
    if not result.promoted:
        raise typer.Exit(code=1)


def _fmt(value, pattern: str) -> str:
    return "–" if value is None else pattern.format(value)


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on; non-loopback needs --token-file or --insecure.")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port.")] = 8000,
    db: DbOpt = Path("runs/kvcost.duckdb"),
    mlflow_uri: MlflowOpt = None,
    analytic_only: Annotated[
        bool, typer.Option(help="Score with the analytic model; do not contact the model registry.")
    ] = False,
    token_file: Annotated[
        Path | None, typer.Option(help="File holding the bearer token required by the write endpoints.")
    ] = None,
    insecure: Annotated[bool, typer.Option(help="Allow a non-loopback --host without a token.")] = False,
    policy: Annotated[str, typer.Option(help="Router policy of /v1/route.")] = "learned_cost_aware",
    model: ModelOpt = "llama-3-8b",
    gpu: Annotated[str, typer.Option(help="GPU type of a worker snapshot that names none.")] = "a100",
    block_size_tokens: Annotated[int, typer.Option(help="KV block size of a request namespace without one.")] = 512,
    max_body_bytes: Annotated[int, typer.Option(help="Larger request bodies are refused with 413.")] = 16 * 2**20,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    kv_events: Annotated[
        list[str] | None,
        typer.Option(
            help="vLLM KV event stream WORKER=tcp://HOST:PORT, or WORKER=PUB,REPLAY with the engine's replay "
            "socket (missed batches are then asked for again); repeatable, one per worker."
        ),
    ] = None,
    served_model_name: Annotated[
        str | None,
        typer.Option(help="Model name requests carry (the engines' --served-model-name); default: --model."),
    ] = None,
    revision: Annotated[str, typer.Option(help="Model revision of the engines (their --revision).")] = "main",
    kv_layout: Annotated[
        str, typer.Option(help="KV dtype and tensor-parallel split of the engines, as requests name it.")
    ] = "bf16-tp1",
    prefix_caching_hash_algo: Annotated[
        str,
        typer.Option(
            help="The engines' --prefix-caching-hash-algo (sha256, sha256_cbor, xxhash, xxhash_cbor): token ids "
            "are hashed as they hash them."
        ),
    ] = "sha256",
    hash_seed: Annotated[
        str, typer.Option(help="The engines' PYTHONHASHSEED (the seed of vLLM's block-hash chain).")
    ] = "0",
    scrape: Annotated[
        list[str] | None,
        typer.Option(
            help="Engine metrics WORKER=http://HOST:PORT/metrics (vLLM or SGLang), scraped into the worker's "
            "snapshot; repeatable."
        ),
    ] = None,
    scrape_interval_s: Annotated[float, typer.Option(help="Seconds between two scrapes of every engine.")] = 1.0,
    tiers: Annotated[
        bool,
        typer.Option(
            help="Engines offload KV to CPU / disk (e.g. LMCache): prefixes their KV events report there are "
            "reusable, at their load time."
        ),
    ] = False,
    reuse_model_dir: Annotated[
        Path | None,
        typer.Option(
            help="Folder of a saved P(reuse) model for /v1/evict/rank's cost_aware (kvcost eviction-study "
            "writes one per cache size: OUT/reuse_models/fraction_*); default: the recency prior."
        ),
    ] = None,
) -> None:
    """Run the scoring API (POST /v1/score, /v1/route, /v1/observe …) on uvicorn until interrupted."""
    import uvicorn
    from pydantic import ValidationError

    from kvcost.models.mlflow_store import DEFAULT_TRACKING_URI
    from kvcost.serving.api import create_app
    from kvcost.serving.settings import ServiceSettings

    def build():
        try:
            settings = ServiceSettings(
                db_path=db,
                mlflow_uri=None if analytic_only else (mlflow_uri or DEFAULT_TRACKING_URI),
                token_file=token_file,
                host=host,
                port=port,
                insecure=insecure,
                model=model,
                gpu_default=gpu,
                block_size_tokens=block_size_tokens,
                kv_events=kv_events or [],
                served_model_name=served_model_name,
                revision=revision,
                kv_layout=kv_layout,
                hash_algorithm=prefix_caching_hash_algo,
                hash_seed=hash_seed,
                scrape=scrape or [],
                scrape_interval_s=scrape_interval_s,
                policy=policy,
                tiers=tiers,
                reuse_model_dir=reuse_model_dir,
                max_body_bytes=max_body_bytes,
            )
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(map(str, first["loc"]))
            raise ValueError(f"{where + ': ' if where else ''}{first['msg'].removeprefix('Value error, ')}") from None
        return settings, create_app(settings)

    settings, api = _guard(build)
    registry = settings.mlflow_uri or "none (analytic model)"
    auth = "bearer token required on write endpoints" if token_file else "no token"
    reuse = f"reuse model {reuse_model_dir}" if reuse_model_dir else "eviction P(reuse): recency prior"
    console.print(
        f"kvcost serve on http://{host}:{port} — log {db}, registry {registry}, policy {policy}, {reuse}, {auth}"
    )
    uvicorn.run(api, host=host, port=port, log_level=log_level)


@app.command("workload")
def workload(name: Annotated[str, typer.Argument(help="gen:<shape>[:k=v,...]")], out: Path, seed: SeedOpt = 0) -> None:
    """Write a generated workload (shared-prefix, multi-turn, agent, mix) as a Mooncake JSONL trace."""
    console.print(f"{_guard(lambda: write_workload(name, out, seed))} requests → {out}")


def _prepare(options: dict) -> RunSpec:
    """Map CLI option names onto :func:`kvcost.replay.runner.prepare`."""
    options = dict(options)
    options["slowdowns"] = options.pop("slowdown") or ()
    trace = options.pop("trace")
    return prepare(trace, **options)


def main() -> None:
    """Entry point for ``python -m kvcost.cli``."""
    app()


if __name__ == "__main__":
    main()
