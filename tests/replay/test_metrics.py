import math

import numpy as np
import pandas as pd
import pytest

from kvcost.data.traces import Trace, TraceRequest
from kvcost.replay.experiment import attribution, attribution_lines
from kvcost.replay.metrics import SUMMARY_KEYS, infinite_cache_hit_ratio, summarise
from kvcost.replay.simulator import ReplayResult


def _trace(requests, block=4) -> Trace:
    rows = tuple(TraceRequest(i, float(i), n, 1, tuple(h)) for i, (n, h) in enumerate(requests))
    return Trace("t", "test", "mooncake", block, rows, 0, None, 1.0, 0.0, None)


def test_infinite_cache_hit_ratio_counts_full_block_prefixes_only():
    trace = _trace(
        [
            (8, (1, 2)),  # cold
            (10, (1, 2, 3)),  # reuses 2 blocks = 8 tokens; block 3 is partial, never cached
            (8, (1, 2)),  # fully cached: capped at input − 1 = 7
            (8, (9, 2)),  # block 2 without its parent 1 is a different prefix: no reuse
        ]
    )
    assert infinite_cache_hit_ratio(trace) == pytest.approx((0 + 8 + 7 + 0) / (8 + 10 + 8 + 8))


def _result(**columns) -> ReplayResult:
    frame = pd.DataFrame({"kv_wait_s": 0.0} | columns)
    return ReplayResult(
        frame, pd.DataFrame(), pd.DataFrame(), np.array([0.5, 0.7]), 10.0, rejected_requests=1, preemptions=2
    )


def test_summarise_exact_figures():
    result = _result(
        worker_id=[0, 0, 1, 0],
        actual_ttft_s=[1.0, 2.0, 3.0, 4.0],
        actual_queue_s=[0.0, 0.5, 1.0, 1.5],
        kv_wait_s=[0.0, 0.0, 0.75, 0.0],
        tpot_s=[0.1, math.nan, 0.3, 0.2],
        input_tokens=[100, 100, 100, 100],
        actual_reuse_tokens=[0, 50, 50, 0],
        predicted_reuse_tokens=[0, 64, 48, 16],
        directory_reuse_tokens=[0, 32, 48, 0],
        directory_mismatch_tokens=[0, 16, 0, 0],
        mismatch_lost_s=[0.0, 0.25, 0.0, 0.0],
        served_by=["recompute", "tier_load", "remote_transfer", "recompute"],
    )
    s = summarise(result, n_workers=2)
    assert list(s) == list(SUMMARY_KEYS)
    assert (s["completed"], s["rejected"], s["preemptions"]) == (4, 1, 2)
    assert s["kv_wait_share"] == 0.25  # 0.75 s of 3 s of queue
    assert s["ttft_mean_s"] == 2.5 and s["ttft_p50_s"] == 2.5
    assert s["ttft_p99_s"] == pytest.approx(3.97)
    assert s["tpot_p50_s"] == pytest.approx(0.2)  # NaN (single-token outputs) ignored
    assert s["hit_ratio"] == 0.25 and s["reused_tokens_mean"] == 25.0
    assert s["max_worker_share"] == 0.75
    assert s["directory_mismatch_tokens"] == 16 and s["mismatch_lost_s"] == 0.25
    assert s["promised_recomputed_share"] == 16 / 128
    # in flight: 32 of request 1's 64 and all 16 of request 3's; request 1's 16 lost come from its in-flight part
    assert s["promised_in_flight_share"] == 48 / 128
    assert s["in_flight_recomputed_share"] == 16 / 48
    assert s["served_by"] == {"local_hit": 0.0, "tier_load": 0.25, "remote_transfer": 0.25, "recompute": 0.5}
    assert s["utilisation"] == pytest.approx(0.6)


def test_attribution_signs():
    configs = {
        "balanced_nocache": {"ttft_p50_s": 5.0, "ttft_p99_s": 20.0},
        "balanced_cache": {"ttft_p50_s": 3.0, "ttft_p99_s": 15.0},
        "cost_aware": {"ttft_p50_s": 3.5, "ttft_p99_s": 10.0},
    }
    assert attribution(configs) == {
        "cache_gain_p50_s": 2.0,
        "cache_gain_p99_s": 5.0,
        "routing_gain_p50_s": -0.5,
        "routing_gain_p99_s": 5.0,
    }
    configs["cost_aware_tiered"] = {"ttft_p50_s": 1.0, "ttft_p99_s": 12.0}
    configs["cost_aware_evicting"] = {"ttft_p50_s": 3.25, "ttft_p99_s": 9.0}
    gains = attribution(configs)
    assert (gains["tier_gain_p50_s"], gains["tier_gain_p99_s"]) == (2.5, -2.0)
    assert (gains["eviction_gain_p50_s"], gains["eviction_gain_p99_s"]) == (0.25, 1.0)
    assert attribution_lines(gains)[3] == "eviction gain (cost_aware → cost_aware_evicting): P50 +0.250 s, P99 +1.000 s"


def test_promise_shares_are_nan_when_nothing_was_promised():
    result = _result(
        worker_id=[0],
        actual_ttft_s=[1.0],
        actual_queue_s=[0.0],
        tpot_s=[0.1],
        input_tokens=[100],
        actual_reuse_tokens=[0],
        predicted_reuse_tokens=[0],
        directory_reuse_tokens=[0],
        directory_mismatch_tokens=[0],
        mismatch_lost_s=[0.0],
        served_by=["recompute"],
    )
    s = summarise(result, n_workers=1)
    assert math.isnan(s["promised_recomputed_share"]) and math.isnan(s["promised_in_flight_share"])
    assert math.isnan(s["in_flight_recomputed_share"])
