"""``kvcost models list|promote``: the kvcost-terms versions in the MLflow registry."""

from __future__ import annotations

from typing import Annotated

import typer

from kvcost.cli.common import MlflowOpt, console, guard, print_table
from kvcost.replay.settings import DEFAULT_RATE_SCALE

models_app = typer.Typer(
    no_args_is_help=True, help="Review the kvcost-terms versions in the MLflow registry.", rich_markup_mode=None
)


@models_app.command("list")
def models_list(mlflow_uri: MlflowOpt = None) -> None:
    """Versions, aliases and holdout metrics of kvcost-terms."""
    from kvcost.models.mlflow_store import list_versions

    rows = guard(lambda: list_versions(mlflow_uri))
    if not rows:
        console.print("no kvcost-terms versions yet: run `kvcost train`")
        return
    header = ["version", "aliases", "TTFT MAE (s)", "analytic MAE (s)", "coverage 90", "feature spec", "run"]
    cells = [
        [
            str(r["version"]),
            ", ".join(r["aliases"]),
            _fmt(r["ttft_mae_s"], "{:.4f}"),
            _fmt(r["analytic_ttft_mae_s"], "{:.4f}"),
            _fmt(r["coverage_90"], "{:.1%}"),
            r["feature_spec_hash"] or "",
            r["run_id"][:12],
        ]
        for r in rows
    ]
    print_table(header, cells, "kvcost-terms versions", labels=2)


@models_app.command("promote")
def models_promote(
    version: Annotated[str | None, typer.Option(help="Version to promote (default: the challenger).")] = None,
    force: Annotated[bool, typer.Option(help="Promote even if worse (needs --reason).")] = False,
    reason: Annotated[str, typer.Option(help="Why a forced promotion is justified; recorded.")] = "",
    trace: Annotated[
        str | None,
        typer.Option(
            help="Also replay the latest window of this trace with each model; promote only if TTFT P50 "
            "and P99 are no worse (without it: gated on holdout MAE and coverage only)."
        ),
    ] = None,
    window_s: Annotated[float, typer.Option(help="Latest window replayed, seconds of trace time.")] = 1800.0,
    workers: Annotated[int, typer.Option(help="A100 workers in the replay.")] = 4,
    rate_scale: Annotated[float, typer.Option(help="Replay arrival times are divided by this.")] = DEFAULT_RATE_SCALE,
    seed: Annotated[int, typer.Option(help="Seed of the replay.")] = 0,
    mlflow_uri: MlflowOpt = None,
) -> None:
    """Move the champion alias to a version if, on the same holdout, it is no worse than the champion
    (and, with --trace, routes a replay of the latest window no worse)."""
    from kvcost.models.mlflow_store import promote
    from kvcost.replay.promotion import ReplayWindow, replay_gate

    def run():
        gate = replay_gate(ReplayWindow(trace, window_s, workers, rate_scale, seed)) if trace else None
        try:
            return promote(mlflow_uri, version, force, reason, routing_gate=gate)
        except LookupError as exc:
            raise ValueError(str(exc)) from None

    result = guard(run)
    cells = [
        [name, f"{f['ttft_mae_s']:.4f}", f"{f['coverage_90']:.1%}", f"{f['coverage_error']:.3f}"]
        for name, f in (("challenger", result.challenger), ("champion", result.champion))
        if f
    ]
    header = ["", "TTFT MAE (s)", "coverage 90", "|coverage − 0.9|"]
    print_table(header, cells, result.message)
    if result.routing is not None:
        routed = [
            [name, f"{f['ttft_p50_s']:.3f}", f"{f['ttft_p99_s']:.3f}"] for name, f in result.routing.figures.items()
        ]
        print_table(["replay", "TTFT P50 (s)", "TTFT P99 (s)"], routed, "")
    if not result.promoted:
        raise typer.Exit(code=1)


def _fmt(value, pattern: str) -> str:
    return "–" if value is None else pattern.format(value)
