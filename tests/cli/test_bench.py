"""Tests for kvcost.cli.bench's console table (the grid itself: tests/replay/test_bench_grid.py)."""

import math

from typer.testing import CliRunner

from kvcost.cli import app
from kvcost.cli.bench import print_bench
from kvcost.cli.common import console


def test_undefined_ratios_print_a_dash_and_unreached_load_levels_are_named():
    row = {"workers": 4, "load": "95%", "policy": "cost_aware", "ttft_p99_s": 1.5, "hit_ratio": 0.5}
    row |= {"p99_vs_best_baseline": 0.75, "p99_vs_oracle": math.nan}
    calibration = [
        {"workers": 4, "load": "80%", "target": 0.8, "rate_scale": 2.0, "utilisation": 0.79, "within_tolerance": True},
        {
            "workers": 4,
            "load": "95%",
            "target": 0.95,
            "rate_scale": 8.0,
            "utilisation": 0.777,
            "within_tolerance": False,
        },
    ]
    result = {"trace": "t", "window": "whole trace", "results": [row], "calibration": calibration, "out": "o"}
    with console.capture() as captured:
        print_bench(result)
    lines = [line.strip() for line in captured.get().splitlines()]
    assert ["4", "95%", "cost_aware", "1.50", "0.75", "–", "50.0%"] in [line.split() for line in lines]
    assert "4 workers, 95%: calibration reached 77.7% utilisation (rate scale 8), not 95% ± 3 points" in lines
    assert not any("80%: calibration" in line for line in lines)
    assert "kvcost bench — t (whole trace; a100 workers serving llama-3-8b)" in lines  # a header without hardware
    hardware = {"gpu": "h100", "model": "llama-3-70b", "tensor_parallel": 4}
    with console.capture() as captured:
        print_bench(result | {"hardware": hardware})
    title = "kvcost bench — t (whole trace; h100 workers serving llama-3-70b, tensor parallel 4)"
    assert title in " ".join(captured.get().split())


def test_constant_load_levels_have_no_calibration_lines():
    result = {"trace": "t", "window": "w", "results": [], "calibration": "constants (rate_scales)", "out": "o"}
    with console.capture() as captured:
        print_bench(result)
    assert "calibration reached" not in captured.get()


def test_the_cli_refuses_given_rate_scales_and_a_recorded_trace_in_one_line(tmp_path):
    runner = CliRunner()
    given = ["bench", "--trace", "gen:mix", "--sensitivity", "--rate-scales", "4=1,2,3", "--sizes", "4"]
    result = runner.invoke(app, [*given, "--out", str(tmp_path / "a")])
    assert result.exit_code == 2 and "--rate-scales = '4=1,2,3' with --sensitivity, expected none" in result.output
    result = runner.invoke(app, ["bench", "--sensitivity", "--out", str(tmp_path / "b")])
    assert result.exit_code == 2 and "mooncake-conversation" in result.output
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
