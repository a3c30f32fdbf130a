"""kvcost: a TTFT cost model for cache-aware LLM routing; trace-replay experiments.

Every command prints a short table at the end, writes machine-readable JSON
next to a Markdown report and PNG plots, shows a progress bar on long work,
and exits with status 2 and a one-line reason on bad input.

Two clocks: ``--start-s`` and ``--duration-s`` select a window in *trace*
time; everything after loading (``--warmup-s``, ``--slowdown …@T_S``, plots,
the log's ``arrival_s``) is *replay* time, i.e. trace time ÷ ``--rate-scale``.

One module per command; the options of ``experiment``, ``replay``, ``bench``,
``eviction-study`` and ``serve`` are generated from their settings models
(:mod:`kvcost.cli.tables`, :mod:`kvcost.cli.options`).
"""

from __future__ import annotations

import typer

from kvcost.cli.bench import bench
from kvcost.cli.cost import cost
from kvcost.cli.eviction_study import eviction_study, eviction_summary
from kvcost.cli.experiment import experiment
from kvcost.cli.models import models_app
from kvcost.cli.options import OneLineErrorsGroup
from kvcost.cli.profile import profile
from kvcost.cli.replay import replay
from kvcost.cli.retrain import retrain
from kvcost.cli.serve import serve
from kvcost.cli.train import train
from kvcost.cli.workload import workload

#: ``rich_markup_mode=None``: click's plain help, which wraps each option's help under its name. typer's rich
#: panels give the help a column of ~18 characters on an 80-column terminal and cut long words with "…"
#: (every policy name in ``replay --help`` read ``aibrix_prefix_ca…``).
app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help=__doc__.splitlines()[0],
    rich_markup_mode=None,
    cls=OneLineErrorsGroup,
)
app.command()(experiment)
app.command("replay")(replay)
app.command()(bench)
app.command("eviction-study")(eviction_study)
app.command("eviction-summary")(eviction_summary)
app.command()(train)
app.command()(retrain)
app.add_typer(models_app, name="models")
app.command()(serve)
app.command()(workload)
app.command()(cost)
app.command()(profile)

__all__ = ["app"]
