"""Every PNG plot kvcost writes, drawn with matplotlib's object-oriented API.

Each function builds a :class:`matplotlib.figure.Figure` directly, saves it with
``Figure.savefig`` (the PNG is rendered by the Agg canvas that ``savefig``
picks for the ``.png`` suffix) and returns it. No ``pyplot``: importing this
module or drawing a plot neither selects a backend nor registers a figure in
pyplot's global figure manager, so nothing happens at import and nothing has
to be closed. Inputs are plain data (arrays, frames, result rows); the
commands that own the domain objects turn them into these inputs.

Callers: ``kvcost train`` (:func:`plot_holdout_ttft`), ``kvcost experiment`` /
``replay`` (:func:`plot_ttft_cdf`, :func:`plot_queues`), ``kvcost bench``
(:func:`plot_p99_vs_load`, :func:`plot_hit_vs_p99`, :func:`plot_queues`) and
``kvcost eviction-study`` (:func:`plot_eviction_study`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: Resolution of every PNG but the eviction study's, dots per inch.
DPI = 110
#: Line styles cycled over the configurations of a TTFT CDF, so that equal curves stay visible.
CDF_LINE_STYLES: tuple[str, ...] = ("-", "--", ":", "-.")
#: (row key, axis label) of the eviction study's three panels, left to right.
EVICTION_PANELS: tuple[tuple[str, str], ...] = (
    ("hit_ratio", "token hit ratio"),
    ("prefill_saved_s", "prefill saved (s)"),
    ("ttft_p99_s", "TTFT P99 (s)"),
)


def plot_holdout_ttft(actual_s: np.ndarray, predicted_s: Mapping[str, np.ndarray], path: Path) -> Figure:
    """Predicted against actual TTFT on the holdout, log–log, one scatter per model, and the diagonal.

    Args:
        actual_s: actual TTFT, seconds, shape ``(n,)``, n ≥ 1.
        predicted_s: label → predicted TTFT, seconds, shape ``(n,)``; drawn in this order.
        path: the PNG to write.

    Returns:
        The saved figure: one axes, one scatter collection per label, then the ``ideal``
        line from 1 ms to max(actual, 1 ms).
    """
    fig = _figure((6, 5.5))
    ax = fig.subplots()
    for label, predicted in predicted_s.items():
        ax.scatter(actual_s, predicted, s=4, alpha=0.35, label=label)
    top = float(max(np.max(actual_s), 1e-3))
    ax.plot([1e-3, top], [1e-3, top], "k--", lw=0.8, label="ideal")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("actual TTFT (s)")
    ax.set_ylabel("predicted TTFT (s)")
    ax.set_title(f"Holdout TTFT, {len(actual_s)} requests", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path, DPI)


def plot_ttft_cdf(ttft_s: Mapping[str, np.ndarray], path: Path, caption: str) -> Figure:
    """Empirical TTFT CDF per configuration on a log time axis.

    Args:
        ttft_s: configuration name → TTFT of its requests, seconds, shape ``(n,)`` in any order;
            a configuration with no request draws no line but still takes its line style.
        path: the PNG to write.
        caption: appended to the title.

    Returns:
        The saved figure: one line per non-empty configuration, x = sorted TTFT, y = i / n for
        i = 1 … n, styles cycling through :data:`CDF_LINE_STYLES`.
    """
    fig = _figure((7, 4.5))
    ax = fig.subplots()
    for i, (name, values) in enumerate(ttft_s.items()):
        ttft = np.sort(np.asarray(values))
        if ttft.size:
            style = CDF_LINE_STYLES[i % len(CDF_LINE_STYLES)]
            ax.plot(ttft, np.arange(1, ttft.size + 1) / ttft.size, style, label=name, lw=1.6)
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(_null_formatter())
    ax.set_xlabel("TTFT (s, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"TTFT CDF — {caption}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return _save(fig, path, DPI)


def plot_queues(samples: Mapping[str, pd.DataFrame], path: Path, caption: str) -> Figure:
    """Each worker's queued prefill tokens over replay time, one panel per run, shared axes.

    Args:
        samples: run name → its ``worker_samples`` frame (columns ``worker_id``, ``t_s`` in seconds,
            ``queued_prefill_tokens``); at least one run.
        path: the PNG to write.
        caption: appended to the title.

    Returns:
        The saved figure: one axes per run, top to bottom, with one line per worker (ascending
        ``worker_id``, label ``worker <id>``); the first panel's workers make the figure legend.
    """
    n = len(samples)
    fig = _figure((8, 2.4 * n + 0.8))
    axes = fig.subplots(n, 1, sharex=True, sharey=True, squeeze=False)
    for ax, (name, frame) in zip(axes[:, 0], samples.items(), strict=True):
        for worker_id, group in frame.groupby("worker_id"):
            ax.plot(group["t_s"], group["queued_prefill_tokens"], lw=0.7, alpha=0.75, label=f"worker {worker_id}")
        ax.set_title(name, fontsize=10)
        ax.set_ylabel("queued prefill\ntokens")
        ax.grid(True, alpha=0.3)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 8), fontsize=8, frameon=False)
    axes[-1, 0].set_xlabel("replay time (s)")
    fig.suptitle(f"Queued prefill tokens per worker — {caption}", fontsize=10)
    return _save(fig, path, DPI, rect=(0, 0.05, 1, 1))


def plot_p99_vs_load(rows: Sequence[Mapping], path: Path, line_styles: Mapping[str, Mapping]) -> Figure:
    """TTFT P99 (log) against the load level (target utilisation), one line per policy, one panel per size.

    Args:
        rows: bench cells with ``workers``, ``policy``, ``load`` (a label such as ``"60%"``) and
            ``ttft_p99_s``; at least one.
        path: the PNG to write.
        line_styles: policy → keyword arguments of ``Axes.plot`` (every policy in ``rows``).

    Returns:
        The saved figure: one axes per worker count (ascending), one line per policy in order of
        first appearance with its cells' (target utilisation in %, P99) sorted by the target.

    The x axis is the offered load (the same arrivals for every policy), not each
    policy's measured utilisation, which a better policy itself lowers.
    """
    sizes = sorted({r["workers"] for r in rows})
    fig = _figure((6 * len(sizes), 4.6))
    axes = fig.subplots(1, len(sizes), squeeze=False, sharey=True)
    for ax, workers in zip(axes[0], sizes, strict=True):
        for policy in dict.fromkeys(r["policy"] for r in rows):
            pts = sorted(
                (float(r["load"].rstrip("%")), r["ttft_p99_s"])
                for r in rows
                if r["policy"] == policy and r["workers"] == workers
            )
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=policy, **line_styles[policy])
        ax.set_yscale("log")
        ax.set_xlabel("offered load: target utilisation (%)")
        ax.set_title(f"{workers} workers", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0, 0].set_ylabel("TTFT P99 (s, log scale)")
    axes[0, -1].legend(fontsize=7, loc="upper left")
    fig.suptitle("TTFT P99 against load", fontsize=11)
    return _save(fig, path, DPI)


def plot_hit_vs_p99(rows: Sequence[Mapping], path: Path, marker_styles: Mapping[str, Mapping]) -> Figure:
    """Hit ratio against TTFT P99 (log), one marker per bench cell; a higher hit ratio need not mean a better P99.

    Args:
        rows: bench cells with ``policy``, ``hit_ratio`` and ``ttft_p99_s``.
        path: the PNG to write.
        marker_styles: policy → keyword arguments of ``Axes.scatter`` (every policy in ``rows``).

    Returns:
        The saved figure: one axes, one scatter collection per policy in order of first appearance,
        its offsets the cells' (hit ratio, P99).
    """
    fig = _figure((7.5, 5))
    ax = fig.subplots()
    for policy in dict.fromkeys(r["policy"] for r in rows):
        pts = [r for r in rows if r["policy"] == policy]
        ax.scatter([r["hit_ratio"] for r in pts], [r["ttft_p99_s"] for r in pts], label=policy, **marker_styles[policy])
    ax.set_yscale("log")
    ax.set_xlabel("token hit ratio")
    ax.set_ylabel("TTFT P99 (s, log scale)")
    ax.set_title("Hit ratio vs TTFT P99 (every size and load)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path, DPI)


def plot_eviction_study(rows: Sequence[Mapping], path: Path, caption: str) -> Figure:
    """Token hit ratio, prefill seconds saved and TTFT P99 per policy against cache fraction (log x).

    Args:
        rows: study runs with ``policy``, ``cache_fraction`` and every key of :data:`EVICTION_PANELS`.
        path: the PNG to write (120 dpi).
        caption: the figure's title.

    Returns:
        The saved figure: three axes (:data:`EVICTION_PANELS` order), one line per policy in order of
        first appearance with its runs' (cache fraction, value) sorted by fraction.
    """
    fig = _figure((15, 4.2))
    axes = fig.subplots(1, 3)
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    for ax, (key, label) in zip(axes, EVICTION_PANELS, strict=True):
        for policy in policies:
            points = sorted((r["cache_fraction"], r[key]) for r in rows if r["policy"] == policy)
            ax.plot(*np.array(points).T, marker="o", label=policy)
        ax.set_xscale("log")
        ax.set_xlabel("cache size (fraction of distinct blocks)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(caption)
    return _save(fig, path, 120)


def _figure(figsize: tuple[float, float]) -> Figure:
    """A new figure of ``figsize`` inches. matplotlib is imported here, not at the top: every kvcost
    command imports this module (through replay.runner), and importing matplotlib takes about 1 s."""
    from matplotlib.figure import Figure

    return Figure(figsize=figsize)


def _null_formatter():
    """A tick formatter that writes nothing (matplotlib imported on first use, as in :func:`_figure`)."""
    from matplotlib.ticker import NullFormatter

    return NullFormatter()


def _save(fig: Figure, path: Path, dpi: int, rect: tuple[float, float, float, float] | None = None) -> Figure:
    """Lay out ``fig`` (inside ``rect``, figure fractions), write it to ``path`` as PNG at ``dpi``; return it."""
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=dpi)
    return fig
