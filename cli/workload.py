"""``kvcost workload``: write a generated workload (shared-prefix, multi-turn, agent, mix) as a Mooncake JSONL trace."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvcost.cli.common import console, guard
from kvcost.data.workloads import write_workload


def workload(
    name: Annotated[str, typer.Argument(help="gen:<shape>[:k=v,...], e.g. gen:agent:requests=2000")],
    out: Annotated[Path, typer.Argument(help="JSONL file to write (Mooncake format).")],
    seed: Annotated[int, typer.Option(help="Generator seed (same seed, same trace).", min=0)] = 0,
) -> None:
    """Write a generated workload (shared-prefix, multi-turn, agent, mix) as a Mooncake JSONL trace."""
    console.print(f"{guard(lambda: write_workload(name, out, seed))} requests → {out}")
