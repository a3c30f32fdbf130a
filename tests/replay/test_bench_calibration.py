"""Load levels by bisection on least_loaded's utilisation, and the physical limit."""

import json
import math

import pytest

from kvcost.core.hardware import StepTimeModel
from kvcost.data.traces import Trace, TraceRequest, load_trace
from kvcost.features.nominal import NominalCosts
from kvcost.replay.bench import (
    DEFAULT_HARDWARE,
    UTILISATION_TOLERANCE,
    BenchCell,
    BenchHardware,
    bench_cells,
    bisect_rate_scale,
    calibrate_load_levels,
    nearby_rate_scales,
    request_service_s,
    run_cell,
    speed_ratio,
)
from kvcost.replay.config import ClusterConfig
from kvcost.replay.metrics import infinite_cache_reuse_tokens, isolated_ttft_s, physical_limit_ttft_p99_s


def saturating(scale: float) -> float:
    return scale / (1 + scale)


def test_bisection_widens_the_bracket_then_halves_it_in_log_scale():
    scale, utilisation, calls = bisect_rate_scale(saturating, 0.6, start=1.0)
    # 1 → 0.5 (below), 2 → 0.667 (above), √2 → 0.586 (within ±0.03)
    assert (scale, calls) == (math.sqrt(2), 3)
    assert utilisation == pytest.approx(0.585786, abs=1e-6)


def test_bisection_searches_downwards_and_reuses_known_replays():
    assert bisect_rate_scale(saturating, 0.2, start=1.0) == (0.25, 0.2, 3)
    known = {1.0: 0.5, 2.0: 2 / 3}
    scale, _, calls = bisect_rate_scale(saturating, 0.6, start=1.0, known=known)
    assert (scale, calls) == (math.sqrt(2), 1)
    assert set(known) == {1.0, 2.0, math.sqrt(2)}


def test_bisection_stops_on_a_plateau_with_the_closest_scale():
    scale, utilisation, calls = bisect_rate_scale(lambda s: min(0.5, 0.4 * s), 0.6, start=1.0)
    assert (scale, utilisation, calls) == (2.0, 0.5, 3)


@pytest.mark.parametrize(("start", "target"), [(0.0, 0.6), (1.0, 1.2)])
def test_bisection_rejects_bad_start_or_target(start, target):
    with pytest.raises(ValueError, match="start = 0.0|target = 1.2"):
        bisect_rate_scale(saturating, target, start=start)


def test_calibration_finds_a_rate_scale_within_tolerance_on_a_small_trace():
    trace = "gen:multi-turn:requests=200"
    found = calibrate_load_levels(trace, workers=1, duration_s=None, seed=0, targets={"60%": 0.6})["60%"]
    assert found.within_tolerance and abs(found.utilisation - 0.6) <= UTILISATION_TOLERANCE
    assert found.replays <= 16
    again = run_cell(BenchCell("least_loaded", "60%", 1, found.rate_scale), trace, None, 0, False)
    assert again["utilisation"] == found.utilisation  # the grid's least_loaded cell measures the same


def test_grid_takes_calibrated_scales():
    cells = bench_cells(["least_loaded"], [2], {2: {"60%": 1.5, "80%": 2.0, "95%": 2.5}})
    assert [(c.load, c.rate_scale) for c in cells] == [("60%", 1.5), ("80%", 2.0), ("95%", 2.5)]


def _trace(requests: list[TraceRequest]) -> Trace:
    return Trace("t", "t", "mooncake", 512, tuple(requests), 0, None, 1.0, 0.0, None)


def test_physical_limit_is_isolated_prefill_of_what_an_infinite_cache_misses():
    trace = _trace(
        [
            TraceRequest(0, 0.0, 1100, 10, (7, 8, 9)),  # nothing cached
            TraceRequest(1, 1.0, 1100, 10, (7, 8, 10)),  # 2 full blocks cached; 9 was a partial block
            TraceRequest(2, 2.0, 1024, 10, (7, 8)),  # fully cached: one token still computed
        ]
    )
    assert infinite_cache_reuse_tokens(trace) == [0, 1024, 1023]
    model = StepTimeModel.for_hardware("llama-3-8b", "a100", token_budget=8192)
    costs = NominalCosts()
    expected = [
        costs.lookup_s(blocks) + model.prefill_alone_s(n, cached) + costs.first_token_s
        for blocks, n, cached in ((2, 1100, 0), (2, 76, 1024), (2, 1, 1023))
    ]
    config = ClusterConfig(fleet=("a100",) * 2)
    assert isolated_ttft_s(trace, config).tolist() == expected
    assert physical_limit_ttft_p99_s(trace, config) == pytest.approx(
        expected[1] + 0.98 * (expected[0] - expected[1]), rel=1e-12
    )


@pytest.mark.slow
def test_physical_limit_of_the_conversation_trace_is_about_13_7_s():
    trace = load_trace("mooncake-conversation")
    assert physical_limit_ttft_p99_s(trace, ClusterConfig()) == pytest.approx(13.66, abs=0.01)


def test_nearby_rate_scales_start_at_the_cell_and_alternate_around_it():
    assert nearby_rate_scales(2.0, 1) == [2.0]
    assert nearby_rate_scales(2.0, 4) == [2.0, 2.0 * (1 - 1e-4), 2.0 * (1 + 1e-4), 2.0 * (1 - 2e-4)]
    with pytest.raises(ValueError) as err:
        nearby_rate_scales(2.0, 0)
    assert str(err.value) == "replays = 0, expected an integer ≥ 1"


def test_a_cell_replayed_three_times_is_its_median_p99_replay():
    trace, cell = "gen:multi-turn:requests=200", BenchCell("least_loaded", "95%", 1, 4.0)
    scales = nearby_rate_scales(4.0, 3)
    alone = [run_cell(BenchCell("least_loaded", "95%", 1, s), trace, None, 0, False) for s in scales]
    row = run_cell(cell, trace, None, 0, False, replays=3)
    p99s = [r["ttft_p99_s"] for r in alone]
    assert row.pop("ttft_p99_replays_s") == p99s and len(set(p99s)) == 3
    median = sorted(alone, key=lambda r: r["ttft_p99_s"])[1]
    assert json.dumps(row, sort_keys=True) == json.dumps(median | {"rate_scale": 4.0}, sort_keys=True)
    assert "ttft_p99_replays_s" not in run_cell(cell, trace, None, 0, False)


class _LinearStepModel:
    """1,000 tokens of KV; a step of n tokens takes 10 ms + 1 ms × n; a prefill of t tokens 0.1 ms × t."""

    def kv_capacity_tokens(self, gpu_memory_utilization):
        return 1000

    def step_s(self, num_tokens, prefill_flops, decode_context_tokens):
        return 0.010 + 0.001 * num_tokens

    def prefill_alone_s(self, new_tokens, context_tokens=0):
        return 0.0001 * new_tokens


def test_a_mean_request_takes_its_prefill_and_its_share_of_a_memory_full_decode_batch(monkeypatch):
    monkeypatch.setattr(ClusterConfig, "step_model", lambda self, gpu: _LinearStepModel())
    trace = _trace([TraceRequest(0, 0.0, 100, 20, (1,)), TraceRequest(1, 1.0, 300, 60, (2,))])
    # mean prompt 200, output 40: context 220 a request, 1000 // 220 = 4 in the batch, a step 14 ms
    assert request_service_s(trace, DEFAULT_HARDWARE) == pytest.approx(0.0001 * 200 + 40 * 0.014 / 4, abs=1e-12)
    with pytest.raises(ValueError, match="trace 't' has no requests"):
        request_service_s(_trace([]), DEFAULT_HARDWARE)


def test_the_calibration_starts_where_the_hardware_serves_the_trace():
    trace = load_trace("gen:multi-turn:requests=200")
    assert speed_ratio(trace, DEFAULT_HARDWARE) == 1.0  # the A100 grid's searches are unchanged
    assert speed_ratio(trace, BenchHardware(gpu="h100")) > 1.5  # the same model, a faster GPU
    assert speed_ratio(trace, BenchHardware(gpu="l40s", model="llama-2-7b")) < 0.7  # slower, and less KV memory
