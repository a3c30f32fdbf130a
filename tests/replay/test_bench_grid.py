import json
import math

import pytest
from typer.testing import CliRunner

from kvcost.cli import app
from kvcost.replay import bench, runner
from kvcost.replay.bench import (
    TARGET_UTILISATION,
    BenchCell,
    BenchHardware,
    add_ratios,
    bench_cells,
    best_baseline,
    rate_scales,
)
from kvcost.replay.bench_report import reading


def test_rate_scales_calibrated_and_scaled():
    assert rate_scales(4) == {"60%": 0.48, "80%": 0.565, "95%": 0.595}
    assert rate_scales(2) == {"60%": 0.24, "80%": 0.2825, "95%": 0.2975}


def test_grid_order_is_size_load_policy():
    cells = bench_cells(["a", "b"], [4])
    assert cells[:3] == [
        BenchCell("a", "60%", 4, 0.48),
        BenchCell("b", "60%", 4, 0.48),
        BenchCell("a", "80%", 4, 0.565),
    ]
    assert len(cells) == 6
    assert {c.eviction_policy for c in cells} == {"lru"}
    assert {c.eviction_policy for c in bench_cells(["a"], [4], eviction_policy="gdsf")} == {"gdsf"}
    assert {c.policy_params for c in cells} == {()}
    params = (("duplicate_price_weight", 0.0),)
    assert {c.policy_params for c in bench_cells(["a"], [4], policy_params=params)} == {params}


def _row(policy, p99, hit=0.05, share=0.3, workers=4, load="80%"):
    return {
        "policy": policy,
        "workers": workers,
        "load": load,
        "ttft_p99_s": p99,
        "hit_ratio": hit,
        "max_worker_share": share,
    }


def test_ratios_against_best_baseline_and_oracle():
    rows = [_row("dynamo_kv", 10.0), _row("llmd_default", 8.0), _row("cost_aware", 6.0), _row("oracle", 5.0)]
    add_ratios(rows)
    assert best_baseline(rows, 4, "80%") == "llmd_default"
    assert [r["p99_vs_best_baseline"] for r in rows] == [1.25, 1.0, 0.75, 0.625]
    assert [r["p99_vs_oracle"] for r in rows] == [2.0, 1.6, 1.2, 1.0]


def test_an_anchor_can_be_the_best_baseline_but_kvcost_cannot():
    rows = [_row("dynamo_kv", 10.0), _row("llmd_predicted_latency", 8.0), _row("learned_cost_aware", 4.0)]
    add_ratios(rows)
    assert best_baseline(rows, 4, "80%") == "llmd_predicted_latency"
    assert [r["p99_vs_best_baseline"] for r in rows] == [1.25, 1.0, 0.5]


def test_ratios_without_oracle_are_nan():
    rows = [_row("dynamo_kv", 10.0), _row("cost_aware", 6.0)]
    add_ratios(rows)
    assert math.isnan(rows[1]["p99_vs_oracle"]) and rows[1]["p99_vs_best_baseline"] == 0.6


def test_reading_flags_higher_hit_ratio_with_worse_p99():
    rows = [_row("dynamo_kv", 10.0, hit=0.05), _row("sglang_cache_aware", 30.0, hit=0.12, share=0.7)]
    add_ratios(rows)
    text = reading(rows)
    assert "best baseline dynamo_kv (P99 10.00 s)" in text
    assert "Higher hit ratio, worse P99: sglang_cache_aware reuses 12.0% of tokens vs 5.0% for dynamo_kv" in text
    assert "3.0× worse (max worker share 70% vs 30%: queueing on hot workers)." in text


def test_reading_blames_hot_workers_only_where_the_load_is_more_skewed():
    rows = [_row("cost_aware", 10.0, hit=0.847, share=0.306), _row("dualmap", 16.0, hit=0.853, share=0.261)]
    add_ratios(rows)
    assert reading(rows).endswith(
        "Higher hit ratio, worse P99: dualmap reuses 85.3% of tokens vs 84.7% for cost_aware yet its P99 is "
        "1.6× worse (max worker share 26% vs 31%: not one hot worker)."
    )


@pytest.mark.parametrize(
    ("policies", "expected"),
    [
        (["least_loaded", "cost_aware"], "4 workers at 80% load: cost_aware P99 6.00 s."),
        (
            ["dynamo_kv", "cost_aware"],
            "4 workers at 80% load: best baseline dynamo_kv (P99 10.00 s); cost_aware "
            "P99 6.00 s = 0.60× the best baseline.",
        ),
    ],
)
def test_reading_names_only_the_references_that_ran(policies, expected):
    p99_s = {"least_loaded": 12.0, "dynamo_kv": 10.0, "cost_aware": 6.0}
    rows = [_row(name, p99_s[name]) for name in policies]
    add_ratios(rows)
    assert reading(rows).startswith(expected)


@pytest.mark.slow
def test_bench_quick_writes_every_output(tmp_path):
    args = [
        "bench",
        "--quick",
        "--sizes",
        "2",
        "--policies",
        "least_loaded,cost_aware,oracle",
        "--jobs",
        "1",
        "--out",
        str(tmp_path),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    bench = json.loads((tmp_path / "bench.json").read_text())
    assert bench["quick"] is True and len(bench["results"]) == 9
    assert bench["eviction_policy"] == "lru" and "the workers evict by `lru`" in (tmp_path / "bench.md").read_text()
    assert {r["policy"] for r in bench["results"]} == {"least_loaded", "cost_aware", "oracle"}
    oracle = [r for r in bench["results"] if r["policy"] == "oracle"]
    assert all(r["p99_vs_oracle"] == 1.0 for r in oracle)
    for name in ("bench.md", "p99_vs_load.png", "hit_ratio_vs_p99.png", "worker_queues.png"):
        assert (tmp_path / name).stat().st_size > 0


@pytest.mark.slow
def test_bench_of_reference_policies_alone_plots_their_queues(tmp_path):
    args = ["bench", "--quick", "--sizes", "2", "--policies", "least_loaded", "--jobs", "1", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output  # was: no anchor and no kvcost policy → a plot of 0 panels
    assert {r["policy"] for r in json.loads((tmp_path / "bench.json").read_text())["results"]} == {"least_loaded"}
    assert (tmp_path / "worker_queues.png").stat().st_size > 0


def test_the_cells_and_the_calibration_replay_under_the_asked_eviction_policy(monkeypatch):
    seen = []

    def recording_replay(trace, config, **kwargs):
        seen.append((config.router.policy, config.eviction_policy))
        return real_replay(trace, config, **kwargs)

    real_replay = bench.replay
    monkeypatch.setattr(bench, "replay", recording_replay)
    bench.run_cell(BenchCell("cost_aware", "60%", 2, 0.5, "gdsf"), "mooncake-conversation", 20.0, 0, False)
    levels = bench.calibrate_load_levels("mooncake-conversation", 2, 20.0, 0, targets={"x": 0.5}, eviction_policy="lhd")
    assert levels["x"].replays == len(seen) - 1 >= 1
    assert seen == [("cost_aware", "gdsf")] + [("least_loaded", "lhd")] * levels["x"].replays


def test_the_cells_and_the_calibration_replay_on_the_asked_hardware(monkeypatch):
    seen = []

    def recording_replay(trace, config, **kwargs):
        seen.append((config.router.policy, config.fleet, config.model, config.tensor_parallel))
        return real_replay(trace, config, **kwargs)

    real_replay = bench.replay
    monkeypatch.setattr(bench, "replay", recording_replay)
    h100 = BenchHardware("h100", "llama-3-70b", 4)
    assert {c.hardware for c in bench_cells(["a"], [4], hardware=h100)} == {h100}
    bench.run_cell(BenchCell("cost_aware", "60%", 2, 0.5, "lru", h100), "mooncake-conversation", 20.0, 0, False)
    levels = bench.calibrate_load_levels("mooncake-conversation", 2, 20.0, 0, targets={"x": 0.5}, hardware=h100)
    assert (
        seen
        == [("cost_aware", ("h100",) * 2, "llama-3-70b", 4)]
        + [("least_loaded", ("h100",) * 2, "llama-3-70b", 4)] * levels["x"].replays
    )


def test_hardware_the_load_level_constants_were_not_measured_on_calibrates_every_trace(monkeypatch, tmp_path):
    asked = []

    def fake_calibrate(trace, sizes, duration_s, seed, jobs, eviction_policy, hardware):
        asked.append(hardware)
        levels = TARGET_UTILISATION.items()
        return {w: {k: bench.Calibration(k, t, w, 0.5, t, 1, True) for k, t in levels} for w in sizes}

    monkeypatch.setattr(runner, "calibrate", fake_calibrate)
    h100 = BenchHardware("h100")
    options = {"sizes": [2], "policies": ["cost_aware"], "quick": True, "jobs": 1}
    header = runner.execute_bench("mooncake-conversation", seed=0, out=tmp_path, hardware=h100, **options)
    assert asked == [h100] and header["hardware"] == {"gpu": "h100", "model": "llama-3-8b", "tensor_parallel": 1}
    assert header["load_levels"] == {"2": {"60%": 0.5, "80%": 0.5, "95%": 0.5}}
    header = runner.execute_bench("mooncake-conversation", seed=0, out=tmp_path, **options)
    assert asked == [h100] and header["load_levels"] == {"2": rate_scales(2)}  # the constants, on their hardware


def test_bench_hardware_refuses_what_no_worker_can_be_by_name():
    with pytest.raises(ValueError, match="^gpu = 'tpu', expected one of a100, "):
        BenchHardware("tpu")
    with pytest.raises(ValueError, match="^model = 'llama-3.1-405b' leaves no KV capacity on a100 with tensor_par"):
        BenchHardware(model="llama-3.1-405b")
    with pytest.raises(ValueError, match="^tensor_parallel = 0, expected an integer ≥ 1$"):
        BenchHardware(tensor_parallel=0)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--eviction-policy", "fifo"], "--eviction-policy = 'fifo', expected one of clairvoyant"),
        (["--sizes", "four"], "sizes = 'four'"),
        (["--policies", "magic"], "unknown router policy 'magic'"),
        (["--sizes", "0"], "sizes = '0', expected comma-separated worker counts ≥ 1"),
        (["--sizes", "4,-2"], "sizes = '4,-2', expected comma-separated worker counts ≥ 1"),
        (["--sizes", ""], "sizes = '', expected comma-separated worker counts ≥ 1"),
        (["--policies", ""], "policies = '', expected comma-separated router policies"),
        (["--gpu", "tpu"], "--gpu = 'tpu', expected one of a100,"),
        (["--model", "llama-3-70b"], "--model = 'llama-3-70b' leaves no KV capacity on a100"),
        (
            ["--policies", "cost_aware,least_loaded", "--policy-param", "hold_tokens=1"],
            "policy_params name 'hold_tokens', expected a parameter of policy 'least_loaded': none",
        ),
    ],
)
def test_bench_rejects_bad_sizes_policies_and_hardware(tmp_path, args, message):
    bad = CliRunner().invoke(app, ["bench", *args, "--out", str(tmp_path)])
    assert bad.exit_code == 2 and message in bad.output
    assert "bench cells" not in bad.output  # refused before any progress bar


def test_bench_replays_each_cell_and_lists_every_p99(tmp_path):
    args = ["bench", "--quick", "--sizes", "2", "--policies", "least_loaded", "--jobs", "1", "--replays", "2"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    bench = json.loads((tmp_path / "bench.json").read_text())
    assert bench["replays"] == 2
    rows = bench["results"]
    assert [len(r["ttft_p99_replays_s"]) for r in rows] == [2, 2, 2]
    assert all(r["ttft_p99_s"] == min(r["ttft_p99_replays_s"]) for r in rows)  # the lower median of two
    report = (tmp_path / "bench.md").read_text()
    assert "median P99 of 2 nearby replays" in report and report.count("P99 over the nearby replays (s): ") == 3
    bad = CliRunner().invoke(app, [*args[:-1], "0", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and "--replays" in bad.output


def test_a_bench_cell_routes_with_the_policy_params_and_the_report_names_them(monkeypatch, tmp_path):
    seen = []

    def recording_replay(trace, config, **kwargs):
        seen.append((config.router.policy, config.router.policy_params))
        return real_replay(trace, config, **kwargs)

    real_replay = bench.replay
    monkeypatch.setattr(bench, "replay", recording_replay)
    params = (("duplicate_price_weight", 0.0),)
    cell = BenchCell("cost_aware", "60%", 2, 0.5, policy_params=params)
    bench.run_cell(cell, "mooncake-conversation", 20.0, 0, False)
    assert seen == [("cost_aware", params)]
    args = ["bench", "--quick", "--sizes", "2", "--policies", "cost_aware", "--jobs", "1"]
    args += ["--rate-scales", "2=0.2,0.3,0.4"]
    result = CliRunner().invoke(app, [*args, "--policy-param", "duplicate_price_weight=0", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "bench.json").read_text())["policy_params"] == {"duplicate_price_weight": 0.0}
    assert (
        "a100 workers serving llama-3-8b, every policy with duplicate_price_weight=0. "
        in (tmp_path / "bench.md").read_text()
    )
