"""What a replay writes: the DuckDB log rows, ``summary.json`` and ``report.md`` (plots: :mod:`kvcost.core.plots`)."""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path

from kvcost.core.reporting import markdown_table
from kvcost.data.store import LogStore
from kvcost.replay.experiment import attribution_lines
from kvcost.replay.metrics import SERVED_BY, SUMMARY_KEYS
from kvcost.replay.simulator import ReplayResult


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


_LABELS = {
    "completed": "completed",
    "rejected": "rejected (too large for KV)",
    "preemptions": "preemptions (KV full)",
    "eviction_policy": "eviction policy",
    "evicted_blocks": "evicted blocks",
    "ttft_mean_s": "TTFT mean (s)",
    "ttft_p50_s": "TTFT P50 (s)",
    "ttft_p90_s": "TTFT P90 (s)",
    "ttft_p99_s": "TTFT P99 (s)",
    "tpot_p50_s": "TPOT P50 (s)",
    "hit_ratio": "hit ratio (tokens)",
    "reused_tokens_mean": "reused tokens (mean)",
    "queue_p99_s": "queue P99 (s)",
    "kv_wait_share": "queue time waiting for KV",
    "max_worker_share": "max worker share",
    "directory_mismatch_tokens": "directory mismatch (tokens)",
    "mismatch_lost_s": "mismatch prefill lost (s)",
    "promised_recomputed_share": "promised tokens recomputed",
    "promised_in_flight_share": "promised tokens in flight",
    "in_flight_recomputed_share": "in-flight promise recomputed",
    "utilisation": "utilisation",
}


def format_value(key: str, value) -> str:
    """Human form of a summary value (percentages for ratios, 3 decimals for seconds)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if key in ("hit_ratio", "utilisation") or key.endswith("_share"):
        return f"{value:.1%}"
    if key.endswith("_s"):
        return f"{value:.3f}"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def comparison_rows(configs: dict[str, dict]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the comparison table: one row per metric, one column per configuration."""
    header = ["metric", *configs]
    rows = []
    for key in SUMMARY_KEYS:
        if key == "served_by":
            for source in SERVED_BY:
                shares = (c[key][source] if key in c else None for c in configs.values())
                rows.append([f"served by {source}", *(f"{x:.1%}" if x is not None else "—" for x in shares)])
            continue
        rows.append([_LABELS[key], *(format_value(key, c.get(key)) for c in configs.values())])
    return header, rows


def write_report_md(path: Path, summary: dict, setup_lines: list[str], plots: list[str]) -> None:
    """Write the Markdown report: set-up, comparison table, and (for the experiment) attribution and diagnosis."""
    header, rows = comparison_rows(summary["configs"])
    parts = [
        f"# kvcost — {summary['trace']}",
        "",
        "## Set-up",
        *[f"- {line}" for line in setup_lines],
        "",
        "## Comparison",
        markdown_table(header, rows),
        "",
        "Utilisation: share of the measured span during which a worker had a request waiting for its first token.",
        "Directory mismatch: reuse the directory promised at routing time that was gone at admission (evicted",
        "while the request queued, or not yet reported when the directory lags).",
        "",
    ]
    if "attribution" in summary:
        parts += [
            "## Attribution (positive = TTFT got shorter)",
            *[f"- {line}" for line in attribution_lines(summary["attribution"])],
            "",
            "## Diagnosis (in order: hot-worker queueing, directory mismatch, recompute of expected hits, tiers, "
            "eviction)",
            *[f"{i}. {line}" for i, line in enumerate(summary["diagnosis"], 1)],
            "",
        ]
    parts += _learned_sections(summary)
    parts += ["## Plots", *[f"![{name}]({name})" for name in plots], ""]
    path.write_text("\n".join(parts))


def _learned_sections(summary: dict) -> list[str]:
    parts: list[str] = []
    if "learned_model" in summary:
        parts += ["## Learned cost model", f"- `learned_cost_aware` routed with: {summary['learned_model']}"]
        a = summary["attribution"]
        if "learned_gain_p99_s" in a:
            parts.append(
                f"- learned gain over cost_aware: P50 {a['learned_gain_p50_s']:+.3f} s, "
                f"P99 {a['learned_gain_p99_s']:+.3f} s"
            )
    if "prediction" in summary:
        p = summary["prediction"]
        kinds = list(p["mae_s"])
        rows = [[term, *(f"{p['mae_s'][k][term]:.4f}" for k in kinds)] for term in p["mae_s"][kinds[0]]]
        parts += [
            "",
            f"Holdout MAE (s) on the last 40 % of this study's {p['holdout_rows']} held-out requests "
            f"(trained on the first 60 %); 90 % bound coverage {p['coverage_90']:.1%}:",
            "",
            markdown_table(["term", *kinds], rows),
        ]
    online = summary.get("online")
    if online:
        speed = [x for x in online["drift_alerts"] if x["metric"] == "speed_ratio"]
        parts += [
            "",
            f"Online learning: {len(online['retrains'])} retrainings "
            f"({sum(x['trigger'] == 'drift' for x in online['retrains'])} triggered by drift); "
            f"{len(online['drift_alerts'])} drift alerts, {len(speed)} straggler (speed) alerts:",
            *[f"- t = {x['t_s']:.0f} s: {x['message']}" for x in speed],
        ]
        if "p99_by_window" in online:
            w = online["p99_by_window"]
            names = [k for k in w if k != "window_s"]
            rows = [
                [f"{i * w['window_s']:g}–{(i + 1) * w['window_s']:g}", *(_p99(w[n], i) for n in names)]
                for i in range(max(len(w[n]) for n in names))
            ]
            parts += [
                "",
                "TTFT P99 (s) per arrival window of replay time:",
                "",
                markdown_table(["window (s)", *names], rows),
            ]
    return [*parts, ""] if parts else []


def _p99(values: list, i: int) -> str:
    return f"{values[i]:.2f}" if i < len(values) and values[i] is not None else "–"
