"""What every command shares: the consoles, the bad-input guard, the progress columns, shared options."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from typing import Annotated, TypeVar

import typer
from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from kvcost.data.traces import TraceFormatError

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)


def results_table(header: list[str], rows: list[list[str]], title: str, labels: int = 1) -> Table:
    """A command's result table, readable on an 80-column terminal.

    No cell is cut with "…" (rich's default for a column too narrow for its longest word: a value folds
    instead, and a table too wide for the terminal stays readable), and borders
    are drawn only under the header (rich's default box took 16 of 80 columns with six columns):

    * the first ``labels`` columns (a metric, a policy name) wrap between words, never inside one;
    * the others are right-aligned and no wider than their widest value or header word; a header word
      longer than 10 characters is broken before an underscore (``cost_aware`` / ``_evicting``), so
      that five arms and their metric fit in 80.

    :func:`print_table` prints one on the console (the console's ``soft_wrap=True`` would render it unwrapped).

    Args:
        header: column titles, ``len(header) >= labels``.
        rows: each a list of ``len(header)`` cell strings.
        title: printed above the table.
        labels: how many leading columns hold labels, ≥ 0.
    """
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    for i, name in enumerate(header):
        if i < labels:
            words = [*name.split(), *(word for row in rows for word in row[i].split())]
            table.add_column(name, min_width=max(map(len, words), default=0))
        else:
            title_ = " ".join(_break_at_underscores(word) for word in name.split(" "))
            widest = max(len(cell) for cell in [*title_.split(), *(row[i] for row in rows)])
            table.add_column(title_, justify="right", max_width=widest, overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table


def print_table(header: list[str], rows: list[list[str]], title: str, labels: int = 1) -> None:
    """Print :func:`results_table` on :data:`console`; a table too wide for the terminal even at its
    narrowest is printed in parts, each with the label columns and about half the value columns (rich
    would otherwise cut the last columns: six experiment arms on 80 columns)."""
    for part_header, part_rows, part_title in _fitting_parts(header, rows, title, labels, console.width):
        console.print(results_table(part_header, part_rows, part_title, labels), soft_wrap=False)


def _fitting_parts(
    header: list[str], rows: list[list[str]], title: str, labels: int, width: int
) -> list[tuple[list[str], list[list[str]], str]]:
    """``(header, rows, title)`` of each part of the table that fits ``width`` columns (one part when it fits,
    or when it has a single value column)."""
    values = len(header) - labels
    unbounded = console.options.update_width(10**4)  # console.measure caps at the console's width
    narrowest = Measurement.get(console, unbounded, results_table(header, rows, title, labels)).minimum
    if values <= 1 or narrowest < width:  # at exactly the width rich still squeezed a column (measured)
        return [(header, rows, title)]
    cut = labels + (values + 1) // 2

    def columns(keep: list[int]) -> tuple[list[str], list[list[str]]]:
        return [header[i] for i in keep], [[row[i] for i in keep] for row in rows]

    first, rest = list(range(cut)), [*range(labels), *range(cut, len(header))]
    return [
        *_fitting_parts(*columns(first), title, labels, width),
        *_fitting_parts(*columns(rest), f"{title} (continued)", labels, width),
    ]


def _break_at_underscores(word: str, width: int = 10) -> str:
    """``word`` in lines of at most ``width`` characters where it can be, broken before its underscores."""
    lines = [""]
    for part in re.split(r"(?=_)", word):
        if lines[-1] and len(lines[-1]) + len(part) > width:
            lines.append("")
        lines[-1] += part
    return "\n".join(lines)


#: Columns of every progress bar.
PROGRESS_COLUMNS = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())


def _tracking_uri(uri: str | None) -> str | None:
    """An explicit ``--mlflow-uri`` naming a SQLite store in a missing folder is a usage error (exit 2)."""
    from kvcost.models.mlflow_store import check_tracking_uri

    try:
        return check_tracking_uri(uri) if uri is not None else None
    except ValueError as exc:  # the one-line refusal names the option and value itself: keep the reason only
        raise typer.BadParameter(str(exc).split(": ", 1)[-1]) from None


MlflowOpt = Annotated[
    str | None,
    typer.Option(
        help="MLflow tracking URI (default sqlite:///runs/mlflow.db; a SQLite store keeps its artifacts in "
        "mlartifacts/ beside it, and its folder must exist).",
        callback=_tracking_uri,
    ),
]

T = TypeVar("T")


def guard(body: Callable[[], T], aliases: Mapping[str, str] | None = None) -> T:
    """Run ``body``; bad input becomes ``error: <reason>`` on stderr and exit status 2.

    Bad input is ``ValueError``, ``KeyError``, ``FileNotFoundError`` or ``TraceFormatError``. A
    reason that starts with a field name (``rate_scale = -1.0, …``) names the option instead
    (``--rate-scale = -1.0, …``); ``aliases`` maps fields whose option has another name to that
    option's parameter (``{"gpu_default": "gpu"}``).
    """
    try:
        return body()
    except (ValueError, KeyError, FileNotFoundError, TraceFormatError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        err_console.print(f"[red]error:[/red] {option_names(message, aliases)}", highlight=False, markup=True)
        raise typer.Exit(code=2) from None


def option_names(message: str, aliases: Mapping[str, str] | None = None) -> str:
    """``rate_scale = -1.0, …`` → ``--rate-scale = -1.0, …`` when the field is a parameter of a ``kvcost`` command."""
    field_name = message.split(" ", 1)[0].rstrip(":")
    option = (aliases or {}).get(field_name, field_name)
    if option not in command_parameters():
        return message
    return "--" + option.replace("_", "-") + message[len(field_name) :]


def command_parameters() -> set[str]:
    """Parameter names of every command of the ``kvcost`` app (and its sub-apps)."""
    from kvcost.cli import app  # the app imports every command module, which import this one

    typers, names = [app], set()
    while typers:
        current = typers.pop()
        for command in current.registered_commands:
            names |= set(inspect.signature(command.callback).parameters)
        typers += [group.typer_instance for group in current.registered_groups]
    return names
