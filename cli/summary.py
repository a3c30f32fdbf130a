"""Running replay arms with a progress bar and printing their comparison (``experiment``, ``replay``)."""

from __future__ import annotations

from pathlib import Path

from rich.progress import Progress

from kvcost.cli.common import PROGRESS_COLUMNS, console, guard, print_table
from kvcost.data.traces import check_trace_name
from kvcost.replay.experiment import Configuration, attribution_lines
from kvcost.replay.outputs import comparison_rows
from kvcost.replay.runner import LearnedSetup, RunSpec, execute, prepare
from kvcost.replay.settings import ReplaySettings


def prepare_spec(settings: ReplaySettings) -> RunSpec:
    """Load the trace and check the cluster and outputs of ``settings``; bad input exits 2."""
    arguments = settings.prepare_arguments()
    guard(lambda: check_trace_name(settings.trace))  # the error names --trace, not only the workload
    return guard(lambda: prepare(arguments.pop("trace"), **arguments))


def run_arms(spec: RunSpec, arms: list[Configuration], learned: LearnedSetup | None = None) -> None:
    """Replay every arm with a progress bar, then print the summary table."""
    with Progress(*PROGRESS_COLUMNS, console=console) as progress:
        task = progress.add_task("replaying", total=len(spec.trace) * len(arms))
        summary = guard(lambda: execute(spec, arms, lambda n: progress.advance(task, n), learned))
    print_summary(summary, spec.out)


def print_summary(summary: dict, out: Path) -> None:
    """The comparison table, attribution, prediction error and report path of ``summary.json``."""
    header, rows = comparison_rows(summary["configs"])
    title = f"kvcost — {summary['trace']}, {summary['workers']} workers evicting by {summary['eviction_policy']}"
    print_table(header, rows, title)
    if summary["skipped_lines"]:
        console.print(f"skipped {summary['skipped_lines']} malformed trace line(s)")
    if "attribution" in summary:
        for line in attribution_lines(summary["attribution"]):
            console.print(line)
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
