"""``kvcost bench --sensitivity``: the bench on a generated workload with each parameter × 0.5 and × 2.

kvcost issue 13 §1 asks for the router's figures with every generator parameter at ×0.5 and ×2
(:func:`kvcost.data.workloads.sensitivity_names`), so that a rule fitted to the generator's
defaults shows. Each variant is an ordinary ``kvcost bench`` (its own calibration of the load
levels, its own folder); this module names the variants and reduces their results to one row
per (variant, cluster size, load, kvcost policy) against that cell's anchors.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from kvcost.core.reporting import markdown_table, write_json
from kvcost.data.workloads import parse_workload_name, sensitivity_names
from kvcost.replay.bench import BASELINE_POLICIES, KVCOST_POLICIES
from kvcost.replay.runner import execute_bench


def sensitivity_traces(trace: str, seed: int) -> list[str]:
    """The ``gen:`` names of ``trace``'s shape with each parameter × 0.5 and × 2, at ``seed``.

    ``trace`` is a bare ``gen:<shape>`` (a ``seed=`` in it wins over ``seed``); the variants
    scale the shape's defaults, so other parameters given in it would be dropped silently.

    Raises:
        ValueError: ``trace`` is not a generated workload, or names parameters besides ``seed``.
        KeyError: unknown shape.
    """
    shape, _, options = trace.partition(":")[2].partition(":")
    _, _, named_seed = parse_workload_name(trace)
    others = [o for o in options.split(",") if o.strip() and not o.strip().startswith("seed=")]
    if others:
        raise ValueError(
            f"trace = {trace!r} with sensitivity, expected 'gen:<shape>' or 'gen:<shape>:seed=N' "
            f"(the variants scale the defaults; got {', '.join(others)})"
        )
    return sensitivity_names(shape, seed if named_seed is None else named_seed)


def folder_name(trace: str) -> str:
    """A file-system-safe folder for one variant: ``gen:mix:seed=0,burst_s=10`` → ``gen_mix_seed_0-burst_s_10``."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", trace.replace(",", "-"))


def sensitivity_rows(benches: dict[str, dict], policies: Sequence[str] = KVCOST_POLICIES) -> list[dict]:
    """One row per (variant, workers, load, kvcost policy that ran) against that cell's anchors.

    Args:
        benches: variant name → the result :func:`kvcost.replay.runner.execute_bench` returned.
        policies: the policies to compare (default: kvcost's own).

    Returns:
        Rows with ``trace``, ``workers``, ``load``, ``rate_scale``, ``utilisation`` (of the
        calibration policy; NaN when the scales were given), ``policy``, ``ttft_p99_s``,
        ``best_anchor``, ``best_anchor_p99_s``, ``p99_vs_best_anchor``, ``ttft_p50_s`` and
        ``lowest_anchor_p50_s``. Cells where no anchor ran are left out.
    """
    rows = []
    for trace, bench in benches.items():
        calibration = bench["calibration"] if isinstance(bench["calibration"], list) else []
        utilisation = {(c["workers"], c["load"]): c["utilisation"] for c in calibration}
        for r in bench["results"]:
            if r["policy"] not in policies:
                continue
            cell = [x for x in bench["results"] if (x["workers"], x["load"]) == (r["workers"], r["load"])]
            anchors = [x for x in cell if x["policy"] in BASELINE_POLICIES]
            if not anchors:
                continue
            best = min(anchors, key=lambda x: x["ttft_p99_s"])
            rows.append(
                {
                    "trace": trace,
                    "workers": r["workers"],
                    "load": r["load"],
                    "rate_scale": r["rate_scale"],
                    "utilisation": utilisation.get((r["workers"], r["load"]), math.nan),
                    "policy": r["policy"],
                    "ttft_p99_s": r["ttft_p99_s"],
                    "best_anchor": best["policy"],
                    "best_anchor_p99_s": best["ttft_p99_s"],
                    "p99_vs_best_anchor": r["ttft_p99_s"] / best["ttft_p99_s"],
                    "ttft_p50_s": r["ttft_p50_s"],
                    "lowest_anchor_p50_s": min(x["ttft_p50_s"] for x in anchors),
                }
            )
    return rows


def sensitivity_summary(rows: list[dict]) -> dict[str, dict]:
    """Per policy: ``rows``, ``geomean_p99_vs_best_anchor``, ``rows_lost`` (P99 above the best
    anchor's) and ``p50_at_or_below_anchors`` (P50 ≤ the anchors' lowest), as issue 13 counts them.

    Load levels that the calibration could not tell apart (one rate scale for two labels, on a
    workload whose utilisation plateaus) are one replay and count once, as in the issue's grid.
    """
    summary = {}
    for policy in dict.fromkeys(r["policy"] for r in rows):
        distinct = {(r["trace"], r["workers"], r["rate_scale"]): r for r in rows if r["policy"] == policy}
        mine = list(distinct.values())
        ratios = [r["p99_vs_best_anchor"] for r in mine]
        summary[policy] = {
            "rows": len(mine),
            "geomean_p99_vs_best_anchor": math.exp(sum(math.log(x) for x in ratios) / len(ratios)),
            "rows_lost": sum(x > 1 for x in ratios),
            "p50_at_or_below_anchors": sum(r["ttft_p50_s"] <= r["lowest_anchor_p50_s"] for r in mine),
        }
    return summary


def write_sensitivity(out: Path, trace: str, seed: int, rows: list[dict]) -> dict:
    """Write ``sensitivity.json`` (rows and summary) and ``sensitivity.md`` into ``out``; returns the summary."""
    summary = sensitivity_summary(rows)
    write_json(out / "sensitivity.json", {"trace": trace, "seed": seed, "summary": summary, "rows": rows})
    table = [
        [
            r["trace"],
            str(r["workers"]),
            r["load"],
            f"{r['utilisation']:.1%}" if not math.isnan(r["utilisation"]) else "–",
            r["policy"],
            f"{r['ttft_p99_s']:.2f}",
            f"{r['best_anchor']} {r['best_anchor_p99_s']:.2f}",
            f"{r['p99_vs_best_anchor']:.2f}×",
            f"{r['ttft_p50_s']:.3f} / {r['lowest_anchor_p50_s']:.3f}",
        ]
        for r in rows
    ]
    header = ["variant", "workers", "load", "utilisation", "policy", "P99 (s)", "best anchor, P99 (s)", "÷ best"]
    lines = [f"# kvcost bench --sensitivity — {trace} (seed {seed})", ""]
    for policy, s in summary.items():
        lines.append(
            f"* `{policy}`: geometric mean of P99 ÷ best anchor {s['geomean_p99_vs_best_anchor']:.3f} over "
            f"{s['rows']} rows; {s['rows_lost']} lost; P50 ≤ the anchors' lowest in {s['p50_at_or_below_anchors']}."
        )
    lines += ["", markdown_table([*header, "P50 / anchors' lowest (s)"], table), ""]
    (out / "sensitivity.md").write_text("\n".join(lines), encoding="utf-8")
    return summary


def execute_sensitivity(trace: str, *, seed: int, out: Path | None, **bench_options) -> dict:
    """Run :func:`~kvcost.replay.runner.execute_bench` on every variant of :func:`sensitivity_traces`.

    Each variant calibrates its own load levels (its utilisation is what the label says) and
    writes its bench into ``out/<folder_name(variant)>``; ``out`` (default
    ``runs/sensitivity-<UTC timestamp>``) also gets ``sensitivity.json`` and ``sensitivity.md``.
    ``bench_options`` are ``execute_bench``'s other keyword arguments (``sizes``, ``policies``,
    ``quick``, ``jobs``, ``replays``, ``progress``), passed to every variant's bench.

    Returns:
        ``{"out", "trace", "seed", "rows", "summary"}`` (rows: :func:`sensitivity_rows`).

    Raises:
        ValueError / KeyError: as :func:`sensitivity_traces` and ``execute_bench``.
    """
    traces = sensitivity_traces(trace, seed)
    out = out if out is not None else Path("runs") / f"sensitivity-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"
    benches = {t: execute_bench(t, seed=seed, out=out / folder_name(t), **bench_options) for t in traces}
    rows = sensitivity_rows(benches)
    summary = write_sensitivity(out, trace, seed, rows)
    return {"out": str(out), "trace": trace, "seed": seed, "rows": rows, "summary": summary}
