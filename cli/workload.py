"""``kvcost workload``: write a generated workload (shared-prefix, multi-turn, agent, mix) as a Mooncake JSONL trace."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvcost.cli.common import console, guard
from kvcost.data.workloads import write_workload


def workload(
    name: Annotated[str, typer.Argument(metavar="NAME", help="gen:<shape>[:k=v,...], e.g. gen:agent:requests=2000")],
    out: Annotated[Path, typer.Argument(metavar="OUT", help="JSONL file to write (Mooncake format, .jsonl).")],
    seed: Annotated[int, typer.Option(help="Generator seed (same seed, same trace).", min=0)] = 0,
) -> None:
    """Write a generated workload (shared-prefix, multi-turn, agent, mix) as a Mooncake JSONL trace."""

    def write() -> int:
        if out.suffix not in (".jsonl", ".json"):
            raise ValueError(f"OUT = {str(out)!r}, expected a .jsonl path (a trace's suffix selects its loader)")
        if not out.parent.is_dir():
            raise ValueError(f"OUT = {str(out)!r}: no folder {str(out.parent)!r}, expected a path in an existing one")
        try:
            return write_workload(name, out, seed)
        except (ValueError, KeyError) as exc:  # the generator's errors name --trace, this command's NAME
            message = exc.args[0] if isinstance(exc, KeyError) else str(exc)
            if message.startswith("trace = "):
                raise ValueError("NAME" + message.removeprefix("trace")) from None
            raise ValueError(f"NAME = {name!r}: {message}") from None

    console.print(f"{guard(write)} requests → {out}")
