"""Outputs of ``kvcost bench``: ``bench.json``, ``bench.md`` and the styles of its plots (:mod:`kvcost.core.plots`)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

from kvcost.core.reporting import markdown_table, write_json
from kvcost.replay.bench import BASELINE_POLICIES, KVCOST_POLICIES, best_baseline
from kvcost.replay.outputs import format_value

_COLUMNS = (
    ("ttft_p50_s", "TTFT P50 (s)"),
    ("ttft_p90_s", "TTFT P90 (s)"),
    ("ttft_p99_s", "TTFT P99 (s)"),
    ("tpot_p50_s", "TPOT P50 (s)"),
    ("hit_ratio", "hit ratio"),
    ("max_worker_share", "max worker share"),
    ("utilisation", "utilisation"),
    ("promised_recomputed_share", "promised recomputed"),
    ("p99_vs_best_baseline", "P99 / best baseline"),
    ("p99_vs_oracle", "P99 / oracle"),
)


def _groups(rows: list[dict]) -> list[tuple[int, str]]:
    seen: list[tuple[int, str]] = []
    for r in rows:
        if (r["workers"], r["load"]) not in seen:
            seen.append((r["workers"], r["load"]))
    return seen


def _ratio(value) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.2f}×"


def write_bench_json(path: Path, header: dict, rows: list[dict]) -> None:
    """``{**header, "results": [one object per (policy, load, workers)]}``."""
    cells = [{k: v for k, v in r.items() if k != "worker_samples"} for r in rows]
    write_json(path, {**header, "results": cells})


def write_bench_md(path: Path, header: dict, rows: list[dict], plots: list[str]) -> None:
    """Tables sorted by P99 per (cluster size, load level) and a one-paragraph reading."""
    parts = [f"# kvcost bench — {header['trace']}", "", reading(rows), "", *_limit_and_levels(header)]
    for workers, load in _groups(rows):
        group = sorted(
            (r for r in rows if r["workers"] == workers and r["load"] == load), key=lambda r: r["ttft_p99_s"]
        )
        table = [
            [r["policy"], *(_ratio(r.get(k)) if k.startswith("p99_vs") else format_value(k, r[k]) for k, _ in _COLUMNS)]
            for r in group
        ]
        parts += [f"## {workers} workers, {load} load (rate scale {group[0]['rate_scale']:g})", ""]
        parts += [markdown_table(["policy", *(label for _, label in _COLUMNS)], table), ""]
        parts += _replay_spread(group)
    parts += [
        f"Set-up: {header['trace']}, window {header['window']}, seed {header['seed']}, prefix cache on "
        f"(the workers evict by `{header.get('eviction_policy', 'lru')}`), {hardware_text(header)}"
        f"{_params_text(header)}. "
        "Utilisation is the share of time a worker had a request "
        "waiting for its first token. The best baseline is the lowest P99 of the anchor routers that ran, of "
        "the nine (not kvcost's own policies, `least_loaded` or `round_robin`)." + _replays_note(header),
        "",
        *[f"![{p}]({p})" for p in plots],
        "",
    ]
    path.write_text("\n".join(parts))


def hardware_text(header: dict) -> str:
    """``"a100 workers serving llama-3-8b"`` (with the tensor-parallel degree when over 1); a header from before
    the hardware was recorded was written on that default."""
    hardware = header.get("hardware", {"gpu": "a100", "model": "llama-3-8b", "tensor_parallel": 1})
    tp = f", tensor parallel {hardware['tensor_parallel']}" if hardware["tensor_parallel"] > 1 else ""
    return f"{hardware['gpu']} workers serving {hardware['model']}{tp}"


def policy_params_text(params: Iterable[tuple[str, float]]) -> str:
    """``"duplicate_price_weight=0, …"`` of a policy's parameters (``RouterSettings.policy_params``); empty for none."""
    return ", ".join(f"{name}={value:g}" for name, value in params)


def _params_text(header: dict) -> str:
    """``", every policy with duplicate_price_weight=0"`` where the bench set policy parameters, else empty."""
    text = policy_params_text((header.get("policy_params") or {}).items())
    return f", every policy with {text}" if text else ""


def _replays_note(header: dict) -> str:
    """The set-up's sentence on nearby replays (empty for one replay a cell)."""
    replays = header.get("replays", 1)
    if replays <= 1:
        return ""
    return (
        f" Each row is the replay with the median P99 of {replays} nearby replays of its cell (rate scale "
        "× (1 + k 10⁻⁴), k = 0, −1, 1, …), each P99 listed under its table."
    )


def _replay_spread(group: list[dict]) -> list[str]:
    """One line listing each policy's P99 over its nearby replays (none when a cell was replayed once)."""
    spread = [
        f"{r['policy']} {min(r['ttft_p99_replays_s']):.2f}–{max(r['ttft_p99_replays_s']):.2f}"
        for r in group
        if "ttft_p99_replays_s" in r
    ]
    return [f"P99 over the nearby replays (s): {'; '.join(spread)}.", ""] if spread else []


def _limit_and_levels(header: dict) -> list[str]:
    """The physical limit and, when the load levels were found by bisection, how close each came."""
    lines = []
    if "physical_limit_ttft_p99_s" in header:
        lines += [
            f"Physical limit: TTFT P99 {header['physical_limit_ttft_p99_s']:.3f} s with isolated prefill, an "
            "infinite shared cache and no queue (no router can do better).",
            "",
        ]
    levels = header.get("calibration")
    if isinstance(levels, list):
        table = [
            [
                str(c["workers"]),
                c["load"],
                f"{c['rate_scale']:.4g}",
                f"{c['utilisation']:.1%}",
                str(c["replays"]),
                "yes" if c["within_tolerance"] else "**no**",
            ]
            for c in levels
        ]
        header_row = ["workers", "load", "rate scale", "least_loaded utilisation", "replays", "within ±3 points"]
        lines += ["Load levels found by bisection on least_loaded:", "", markdown_table(header_row, table), ""]
    return lines


def reading(rows: list[dict]) -> str:
    """One paragraph: who wins where, how kvcost compares, where hit ratio and P99 disagree."""
    sentences = []
    for workers, load in _groups(rows):
        group = {r["policy"]: r for r in rows if r["workers"] == workers and r["load"] == load}
        base = best_baseline(rows, workers, load)
        parts = [f"best baseline {base} (P99 {group[base]['ttft_p99_s']:.2f} s)"] if base else []
        for name in KVCOST_POLICIES:
            if name in group:
                r = group[name]
                part = f"{name} P99 {r['ttft_p99_s']:.2f} s"
                if base:
                    part += f" = {_ratio(r.get('p99_vs_best_baseline'))} the best baseline"
                if "oracle" in group:
                    part += f", {_ratio(r.get('p99_vs_oracle'))} the oracle"
                parts.append(part)
        sentences.append(f"{workers} workers at {load} load: " + "; ".join(parts) + ".")
        sentences += _hit_ratio_warnings(group)
    return " ".join(sentences)


#: Points of max worker share by which a policy's load must be more skewed than the best one's for
#: the reading to blame hot-worker queueing (5 points: a fifth of a worker's fair share on 4 workers).
HOT_SHARE_MARGIN = 0.05


def _hit_ratio_warnings(group: dict[str, dict]) -> list[str]:
    best = min(group.values(), key=lambda r: r["ttft_p99_s"])
    worse = [
        r
        for r in group.values()
        if r["hit_ratio"] > best["hit_ratio"] + 0.005 and r["ttft_p99_s"] > 1.2 * best["ttft_p99_s"]
    ]
    if not worse:
        return []
    top = max(worse, key=lambda r: r["hit_ratio"])
    share, best_share = top["max_worker_share"], best["max_worker_share"]
    # hot-worker queueing is named as the cause only where the load really is more skewed
    why = "queueing on hot workers" if share > best_share + HOT_SHARE_MARGIN else "not one hot worker"
    return [
        f"Higher hit ratio, worse P99: {top['policy']} reuses {top['hit_ratio']:.1%} of tokens vs "
        f"{best['hit_ratio']:.1%} for {best['policy']} yet its P99 is {top['ttft_p99_s'] / best['ttft_p99_s']:.1f}× "
        f"worse (max worker share {share:.0%} vs {best_share:.0%}: {why})."
    ]


def line_styles(rows: list[dict]) -> dict[str, dict]:
    """Policy → ``Axes.plot`` keywords for :func:`~kvcost.core.plots.plot_p99_vs_load`, every policy in ``rows``.

    kvcost's policies thick with round markers, the oracle a black dashed line with
    crosses, the production baselines thin with dots, anything else dotted.
    """
    return {policy: _line_style(policy) for policy in dict.fromkeys(r["policy"] for r in rows)}


def marker_styles(rows: list[dict]) -> dict[str, dict]:
    """Policy → ``Axes.scatter`` keywords for :func:`~kvcost.core.plots.plot_hit_vs_p99`, every policy in ``rows``.

    The line style's marker (``.`` if none) and colour; kvcost's policies larger (40 vs 22 points²).
    """
    styles = {}
    for policy in dict.fromkeys(r["policy"] for r in rows):
        style = _line_style(policy)
        size = 40 if policy in KVCOST_POLICIES else 22
        styles[policy] = {"marker": style.get("marker", "."), "s": size, "color": style.get("color")}
    return styles


def _line_style(policy: str) -> dict:
    if policy in KVCOST_POLICIES:
        return {"lw": 2.4, "marker": "o"}
    if policy == "oracle":
        return {"lw": 1.4, "ls": "--", "color": "black", "marker": "x"}
    if policy in BASELINE_POLICIES:
        return {"lw": 1.2, "marker": "."}
    return {"lw": 1.0, "ls": ":", "marker": "."}
