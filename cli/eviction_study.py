"""``kvcost eviction-study``: every eviction policy at several what-if cache sizes; ``kvcost eviction-summary``:
one policy against the best of a set over several studies."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import Progress

from kvcost.cli.common import PROGRESS_COLUMNS, console, guard, print_table
from kvcost.cli.options import with_settings
from kvcost.cli.tables import EVICTION_STUDY
from kvcost.replay.eviction_summary import (
    DEFAULT_AGAINST,
    DEFAULT_TOLERANCE,
    group_figures,
    load_study,
    parse_groups,
    summary_cells,
)
from kvcost.replay.settings import DEFAULT_REFIT_EVERY_S, ReplaySettings


@with_settings(EVICTION_STUDY)
def eviction_study(
    settings: ReplaySettings,
    fractions: Annotated[str, typer.Option(help="Cache sizes: fractions of the trace's distinct blocks.")] = (
        "0.05,0.1,0.25,0.5"
    ),
    policies: Annotated[str | None, typer.Option(help="Comma-separated eviction policies (default: all).")] = None,
    horizon_s: Annotated[
        float | None, typer.Option(help="cost_aware's reuse horizon H, s (default: measured on the training log).")
    ] = None,
    reuse_model: Annotated[
        str, typer.Option(help="cost_aware's P(reuse): cure (default), prior or lightgbm.")
    ] = "cure",
    refit_every_s: Annotated[
        float,
        typer.Option(
            min=0,
            help="Refit cost_aware's cure P(reuse) on the pools' block history every S replay seconds (0: never).",
        ),
    ] = DEFAULT_REFIT_EVERY_S,
    jobs: Annotated[int, typer.Option(min=1, help="Parallel processes.")] = 2,
) -> None:
    """Every eviction policy at several what-if cache sizes: eviction.json, eviction.md, eviction.png."""
    from kvcost.replay.eviction_study import (
        STUDY_POLICIES,
        StudySettings,
        check_settings,
        headroom_lines,
        run_study,
        study_table,
    )

    def parse() -> StudySettings:
        try:
            sizes = tuple(float(x) for x in fractions.split(",") if x.strip())
        except ValueError:
            raise ValueError(f"fractions = {fractions!r}, expected comma-separated numbers such as 0.05,0.1") from None
        names = tuple(p.strip() for p in policies.split(",") if p.strip()) if policies else STUDY_POLICIES
        study = StudySettings(
            trace=settings.trace,
            duration_s=settings.duration_s,
            fractions=sizes,
            policies=names,
            rate_scale=settings.rate_scale,
            seed=settings.seed,
            horizon_s=horizon_s,
            reuse_model=reuse_model,
            refit_every_s=None if refit_every_s == 0 else refit_every_s,
            jobs=jobs,
        )
        check_settings(study)
        return study

    study = guard(parse)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    folder = settings.out if settings.out is not None else Path("runs") / f"eviction-{stamp}"
    total = len(study.fractions) * (len(study.policies) + ("cost_aware" in study.policies))
    with Progress(*PROGRESS_COLUMNS, console=console) as progress:
        task = progress.add_task("eviction study runs", total=total)
        result = guard(lambda: run_study(study, folder, lambda n: progress.advance(task, n)))
    header, rows = study_table(result["results"])
    title = f"kvcost eviction study — {result['trace']} ({result['distinct_blocks']} blocks)"
    print_table(header, rows, title, labels=3)
    for gain in result["cost_aware_vs_lru"]:
        console.print(
            f"cache {gain['cache_fraction']:g}: cost_aware saves "
            f"{gain['prefill_saved_gain']:+.1%} prefill seconds vs lru"
        )
    if result["headroom"]:
        console.print(headroom_lines(result["headroom"]))
    console.print(f"report: {folder / 'eviction.md'} ({result['wall_s']:.0f} s)")


def eviction_summary(
    runs: Annotated[
        list[Path], typer.Argument(help="Folders (or eviction.json files) of `kvcost eviction-study` runs.")
    ],
    policy: Annotated[str, typer.Option(help="The policy summarised.")] = "cost_aware",
    against: Annotated[
        str, typer.Option(help="Comma-separated policies whose best it is measured against.")
    ] = ",".join(DEFAULT_AGAINST),
    groups: Annotated[
        str, typer.Option(help="Groups of cache fractions, ';' between groups, ',' within: figures per group.")
    ] = "0.05,0.1;0.25,0.5",
    tolerance: Annotated[float, typer.Option(help="A cell is 'within' the best when its gain is ≥ −this.")] = (
        DEFAULT_TOLERANCE
    ),
) -> None:
    """One eviction policy against the best of a set over several studies: per cell, and per group of cache sizes."""
    names = tuple(p.strip() for p in against.split(",") if p.strip())
    studies = [guard(lambda run=run: load_study(run)) for run in runs]
    cells = guard(lambda: summary_cells(studies, policy, names))
    figures = guard(lambda: group_figures(cells, parse_groups(groups), tolerance))
    header = ["trace", "seed", "cache", "best other (s)", f"{policy} (s)", "÷ best − 1", "clairvoyant ÷ best − 1"]
    rows = [
        [
            c.trace,
            str(c.seed),
            f"{c.cache_fraction:g}",
            f"{c.best_other} {c.best_other_s:.1f}",
            f"{c.policy_s:.1f}",
            _percent(c.gain),
            _percent(c.clairvoyant_gain),
        ]
        for c in cells
    ]
    print_table(header, rows, f"kvcost eviction summary — {policy} against the best of {', '.join(names)}", labels=3)
    for g in figures:
        console.print(
            f"cache {'/'.join(f'{f:g}' for f in g.fractions)}: {g.cells} cells, mean {policy} ÷ best − 1 "
            f"{_percent(g.mean_gain, 2)}, {g.at_or_above} at or above the best, {g.within} within {tolerance:.0%}"
        )


def _percent(gain: float, digits: int = 1) -> str:
    """``+1.2%`` (``digits`` decimals), or ``–`` for a gain that does not exist (NaN: no reference run, a best that
    saved nothing, or a group without a cell)."""
    return "–" if math.isnan(gain) else f"{gain:+.{digits}%}"
