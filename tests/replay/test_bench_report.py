"""The bench plots' styles: kvcost's policies stand out, the oracle is a black reference."""

from kvcost.replay.bench_report import line_styles, marker_styles

ROWS = [{"policy": p} for p in ("cost_aware", "sglang_cache_aware", "oracle", "round_robin", "cost_aware")]


def test_line_styles_per_policy_in_order_of_appearance():
    assert line_styles(ROWS) == {
        "cost_aware": {"lw": 2.4, "marker": "o"},
        "sglang_cache_aware": {"lw": 1.2, "marker": "."},
        "oracle": {"lw": 1.4, "ls": "--", "color": "black", "marker": "x"},
        "round_robin": {"lw": 1.0, "ls": ":", "marker": "."},
    }


def test_marker_styles_take_the_line_marker_and_colour():
    assert marker_styles(ROWS) == {
        "cost_aware": {"marker": "o", "s": 40, "color": None},
        "sglang_cache_aware": {"marker": ".", "s": 22, "color": None},
        "oracle": {"marker": "x", "s": 22, "color": "black"},
        "round_robin": {"marker": ".", "s": 22, "color": None},
    }
