"""What a replay writes: the DuckDB log rows, ``summary.json``, ``report.md`` and PNG plots."""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from kvcost.data.store import LogStore  # noqa: E402
from kvcost.replay.metrics import SUMMARY_KEYS  # noqa: E402
from kvcost.replay.simulator import ReplayResult  # noqa: E402


def log_replay(
    store: LogStore,
    run_id: str,
    configuration: str,
    trace: str,
    params: dict,
    started_at: datetime,
    result: ReplayResult,
) -> None:
    """Append one replay to the DuckDB log (``runs``, ``requests``, ``candidates``, ``worker_samples``)."""
    store.write_run(run_id, configuration, trace, params, started_at)
    store.write_frame("requests", run_id, result.requests)
    store.write_frame("candidates", run_id, result.candidates)
    store.write_frame("worker_samples", run_id, result.worker_samples)


def write_summary_json(path: Path, summary: dict) -> None:
    """Write ``summary`` as indented JSON with sorted keys (NaN written as null)."""
    path.write_text(json.dumps(_finite(summary), indent=2, sort_keys=True) + "\n")


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


_LABELS = {
    "completed": "completed",
    "rejected": "rejected (too large for KV)",
    "ttft_mean_s": "TTFT mean (s)",
    "ttft_p50_s": "TTFT P50 (s)",
    "ttft_p90_s": "TTFT P90 (s)",
    "ttft_p99_s": "TTFT P99 (s)",
    "tpot_p50_s": "TPOT P50 (s)",
    "hit_ratio": "hit ratio (tokens)",
    "reused_tokens_mean": "reused tokens (mean)",
    "queue_p99_s": "queue P99 (s)",
    "max_worker_share": "max worker share",
    "directory_mismatch_tokens": "directory mismatch (tokens)",
    "utilisation": "utilisation",
}


def format_value(key: str, value) -> str:
    """Human form of a summary value (percentages for ratios, 3 decimals for seconds)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if key in ("hit_ratio", "max_worker_share", "utilisation"):
        return f"{value:.1%}"
    if key.endswith("_s"):
        return f"{value:.3f}"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def comparison_rows(configs: dict[str, dict]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the comparison table: one row per metric, one column per configuration."""
    header = ["metric", *configs]
    rows = [[_LABELS[key], *(format_value(key, c[key]) for c in configs.values())] for key in SUMMARY_KEYS]
    return header, rows


def _markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def write_report_md(path: Path, summary: dict, setup_lines: list[str], plots: list[str]) -> None:
    """Write the Markdown report: set-up, comparison table, attribution, diagnosis and plots."""
    header, rows = comparison_rows(summary["configs"])
    attribution = summary["attribution"]
    parts = [
        f"# kvcost experiment — {summary['trace']}",
        "",
        "## Set-up",
        *[f"- {line}" for line in setup_lines],
        "",
        "## Comparison",
        _markdown_table(header, rows),
        "",
        "## Attribution (positive = TTFT got shorter)",
        f"- cache gain (balanced_nocache → balanced_cache): P50 {attribution['cache_gain_p50_s']:+.3f} s, "
        f"P99 {attribution['cache_gain_p99_s']:+.3f} s",
        f"- routing gain (balanced_cache → cost_aware): P50 {attribution['routing_gain_p50_s']:+.3f} s, "
        f"P99 {attribution['routing_gain_p99_s']:+.3f} s",
        "",
        "## Diagnosis (DESIGN.md §4 order)",
        *[f"{i}. {line}" for i, line in enumerate(summary["diagnosis"], 1)],
        "",
        "## Plots",
        *[f"![{name}]({name})" for name in plots],
        "",
    ]
    path.write_text("\n".join(parts))


def plot_ttft_cdf(results: dict[str, ReplayResult], path: Path) -> None:
    """TTFT CDF per configuration (log-scaled time axis)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, result in results.items():
        ttft = np.sort(result.requests["actual_ttft_s"].to_numpy())
        if ttft.size:
            ax.plot(ttft, np.arange(1, ttft.size + 1) / ttft.size, label=name)
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("TTFT CDF")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_queues(results: dict[str, ReplayResult], path: Path) -> None:
    """Each worker's queued prefill tokens over time, one panel per configuration."""
    fig, axes = plt.subplots(len(results), 1, figsize=(8, 2.6 * len(results)), sharex=True, squeeze=False)
    for ax, (name, result) in zip(axes[:, 0], results.items(), strict=True):
        samples = result.worker_samples
        for worker_id, group in samples.groupby("worker_id"):
            ax.plot(group["t_s"], group["queued_prefill_tokens"], lw=0.8, label=f"worker {worker_id}")
        ax.set_title(name, fontsize=10)
        ax.set_ylabel("queued prefill\ntokens")
        ax.grid(True, alpha=0.3)
    axes[0, 0].legend(fontsize=7, ncol=4, loc="upper right")
    axes[-1, 0].set_xlabel("time (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
