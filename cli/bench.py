"""``kvcost bench``: every policy at ~60/80/95 % utilisation on several cluster sizes."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import Progress

from kvcost.cli.common import PROGRESS_COLUMNS, console, guard, print_table
from kvcost.cli.options import with_settings
from kvcost.cli.tables import BENCH
from kvcost.core.hardware import GPUS
from kvcost.data.traces import check_trace_name
from kvcost.replay.bench import DEFAULT_HARDWARE, BenchHardware
from kvcost.replay.bench_report import hardware_text
from kvcost.replay.runner import bench_policies, execute_bench, parse_rate_scales
from kvcost.replay.sensitivity import execute_sensitivity, sensitivity_traces
from kvcost.replay.settings import ReplaySettings
from kvcost.routing.policies import check_policy_params


@with_settings(BENCH)
def bench(
    settings: ReplaySettings,
    quick: Annotated[bool, typer.Option(help="Replay only the first 120 s of trace time (CI smoke run).")] = False,
    sizes: Annotated[str, typer.Option(help="Cluster sizes, comma-separated worker counts.")] = "4,8",
    policies: Annotated[str | None, typer.Option(help="Comma-separated policies (default: all).")] = None,
    jobs: Annotated[int, typer.Option(min=1, help="Parallel processes.")] = 2,
    rate_scales: Annotated[
        str | None,
        typer.Option(
            help="Skip the calibration: rate scales per size for 60/80/95 %, e.g. '4=0.55,0.71,1;8=0.92,1.19,2' "
            "(copied from a previous bench.json's load_levels)."
        ),
    ] = None,
    replays: Annotated[
        int,
        typer.Option(
            min=1,
            help="Replays per cell at nearby rate scales (× (1 + k 10⁻⁴)); each row is its median-P99 replay "
            "and bench.md lists every replay's P99. A busy cell's P99 moves by ±7–20 % between such replays.",
        ),
    ] = 1,
    gpu: Annotated[
        str,
        typer.Option(help=f"GPU type of every worker: {', '.join(GPUS.names())} (with --model and --tensor-parallel)."),
    ] = DEFAULT_HARDWARE.gpu,
    sensitivity: Annotated[
        bool,
        typer.Option(
            help="Bench every variant of a generated workload with one parameter × 0.5 and × 2 (--trace "
            "gen:<shape>); each variant calibrates its own load levels. Writes sensitivity.json and .md."
        ),
    ] = False,
) -> None:
    """Every policy at ~60/80/95 % utilisation on 4 and 8 workers: bench.json, bench.md, plots."""

    def parse() -> tuple[list[int], list[str], dict | None, BenchHardware]:
        try:
            size_list = [int(x) for x in sizes.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"sizes = {sizes!r}, expected comma-separated integers such as '4,8'") from None
        if not size_list or min(size_list) < 1:
            raise ValueError(f"sizes = {sizes!r}, expected comma-separated worker counts ≥ 1 such as '4,8'")
        if sensitivity and rate_scales is not None:
            raise ValueError(
                f"rate_scales = {rate_scales!r} with --sensitivity, expected none (each variant calibrates its own)"
            )
        given = parse_rate_scales(rate_scales, size_list) if rate_scales is not None else None
        check_trace_name(settings.trace)
        hardware = BenchHardware(gpu, settings.model, settings.tensor_parallel)
        names = bench_policies([p.strip() for p in policies.split(",")] if policies is not None else None)
        for name in names:
            check_policy_params(name, settings.policy_params)
        return size_list, names, given, hardware

    size_list, names, given, hardware = guard(parse)
    options = {
        "sizes": size_list,
        "policies": names,
        "quick": quick,
        "jobs": jobs,
        "replays": replays,
        "eviction_policy": settings.eviction_policy,
        "hardware": hardware,
        "policy_params": settings.policy_params,
    }
    if sensitivity:
        _sensitivity(settings, options)
        return
    total = len(size_list) * 3 * len(names)
    result = _with_progress("bench cells", total, execute_bench, settings, options | {"given_scales": given})
    print_bench(result)


def _with_progress(label: str, total: int, execute, settings: ReplaySettings, options: dict) -> dict:
    """``execute(trace, seed=, out=, progress=, **options)`` under a progress bar of ``total`` cells."""
    with Progress(*PROGRESS_COLUMNS, console=console) as progress:
        task = progress.add_task(label, total=total)
        return guard(
            lambda: execute(
                settings.trace,
                seed=settings.seed,
                out=settings.out,
                progress=lambda n: progress.advance(task, n),
                **options,
            )
        )


def _sensitivity(settings: ReplaySettings, options: dict) -> None:
    """``--sensitivity``: the bench of every variant (``execute_bench``'s ``options``), then one line per kvcost
    policy."""
    traces = guard(lambda: sensitivity_traces(settings.trace, settings.seed))
    total = len(traces) * len(options["sizes"]) * 3 * len(options["policies"])
    result = _with_progress("sensitivity cells", total, execute_sensitivity, settings, options)
    for policy, s in result["summary"].items():
        console.print(
            f"{policy}: P99 ÷ best anchor {s['geomean_p99_vs_best_anchor']:.3f} (geometric mean over {s['rows']} "
            f"rows), {s['rows_lost']} lost, P50 ≤ the anchors' lowest in {s['p50_at_or_below_anchors']}"
        )
    console.print(f"report: {Path(result['out']) / 'sensitivity.md'}")


def print_bench(result: dict) -> None:
    """The bench table, best first per cluster size and load, and the report path."""
    header = ["workers", "load", "policy", "TTFT P99 (s)", "× best baseline", "× oracle", "hit ratio"]
    rows = [
        [
            str(r["workers"]),
            r["load"],
            r["policy"],
            f"{r['ttft_p99_s']:.2f}",
            _ratio(r["p99_vs_best_baseline"]),
            _ratio(r["p99_vs_oracle"]),
            f"{r['hit_ratio']:.1%}",
        ]
        for r in sorted(result["results"], key=lambda r: (r["workers"], r["load"], r["ttft_p99_s"]))
    ]
    title = f"kvcost bench — {result['trace']} ({result['window']}; {hardware_text(result)})"
    print_table(header, rows, title, labels=3)
    calibration = result["calibration"]  # a list of levels, or a string when the scales were not calibrated
    missed = [c for c in calibration if not c["within_tolerance"]] if isinstance(calibration, list) else []
    for c in missed:
        console.print(
            f"{c['workers']} workers, {c['load']}: calibration reached {c['utilisation']:.1%} utilisation "
            f"(rate scale {c['rate_scale']:g}), not {c['target']:.0%} ± 3 points"
        )
    console.print(
        "best baseline: the lowest P99 of the anchor routers that ran, of the nine "
        "(not kvcost's own policies, least_loaded or round_robin)"
    )
    console.print(f"report: {Path(result['out']) / 'bench.md'}")


def _ratio(value: float) -> str:
    """A ratio to two decimals; ``–`` when it is undefined (NaN: the reference policy was not run)."""
    return "–" if math.isnan(value) else f"{value:.2f}"
