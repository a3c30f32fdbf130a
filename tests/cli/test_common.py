"""``kvcost.cli.common``: result tables that an 80-column terminal shows whole."""

from rich.console import Console

from kvcost.cli.common import _break_at_underscores, _fitting_parts, results_table


def _render(table, width: int) -> list[str]:
    console = Console(width=width, record=True, color_system=None)
    console.print(table, soft_wrap=False)
    return console.export_text().splitlines()


def test_five_arms_and_their_metrics_fit_80_columns_uncut():
    arms = ["balanced_nocache", "balanced_cache", "cost_aware", "cost_aware_tiered", "cost_aware_evicting"]
    rows = [["promised tokens recomputed", *["100.0%"] * 5], ["served by remote_transfer", *["19.572"] * 5]]
    lines = _render(results_table(["metric", *arms], rows, "t"), 80)
    assert max(map(len, lines)) <= 80
    assert not any("…" in line for line in lines)
    assert "remote_transfer" in "".join(lines)  # a label wraps between words, never inside one
    assert lines[2].split() == ["balanced", "balanced", "cost_aware", "cost_aware"]
    assert lines[3].split() == ["metric", "_nocache", "_cache", "cost_aware", "_tiered", "_evicting"]


def test_a_table_too_wide_at_its_narrowest_is_printed_in_parts_with_its_labels():
    arms = ["balanced_nocache", "balanced_cache", "cost_aware", "cost_aware_tiered", "cost_aware_evicting"]
    rows = [["promised tokens recomputed", *["100.0%"] * 6], ["served by remote_transfer", *["19.572"] * 6]]
    header = ["metric", *arms, "learned_cost_aware"]
    parts = _fitting_parts(header, rows, "t", 1, 80)
    assert [(h, title) for h, _, title in parts] == [
        (["metric", *arms[:3]], "t"),
        (["metric", *arms[3:], "learned_cost_aware"], "t (continued)"),
    ]
    assert parts[1][1][0] == ["promised tokens recomputed", "100.0%", "100.0%", "100.0%"]
    for part_header, part_rows, title in parts:
        assert max(map(len, _render(results_table(part_header, part_rows, title), 80))) <= 80
    assert len(_fitting_parts(header[:-1], [r[:-1] for r in rows], "t", 1, 80)) == 1  # five arms fit whole


def test_bench_labels_keep_whole_policy_names():
    rows = [["4", "95 %", "llmd_predicted_latency", "53.07", "0.90", "1.21", "7.6%"]]
    header = ["workers", "load", "policy", "TTFT P99 (s)", "× best baseline", "× oracle", "hit ratio"]
    lines = _render(results_table(header, rows, "t", labels=3), 80)
    assert max(map(len, lines)) <= 80
    assert [line.split() for line in lines if "llmd" in line] == [["4", "95", "%", *rows[0][2:]]]


def test_break_at_underscores():
    assert _break_at_underscores("cost_aware_evicting") == "cost_aware\n_evicting"
    assert _break_at_underscores("balanced_nocache") == "balanced\n_nocache"
    assert _break_at_underscores("cost_aware") == "cost_aware"
    assert _break_at_underscores("llmd_predicted_latency") == "llmd\n_predicted\n_latency"
