"""Tests for kvcost.replay.sensitivity: the variants, the rows against each cell's anchors, the summary."""

import json
import math

import pytest

from kvcost.data.workloads import sensitivity_names
from kvcost.replay import sensitivity
from kvcost.replay.sensitivity import (
    folder_name,
    sensitivity_rows,
    sensitivity_summary,
    sensitivity_traces,
)


def _row(policy, p99, p50, load="80%"):
    return {"policy": policy, "workers": 4, "load": load, "rate_scale": 2.0, "ttft_p99_s": p99, "ttft_p50_s": p50}


def _bench(rows, calibration=None):
    return {"results": rows, "calibration": calibration if calibration is not None else "given (--rate-scales)"}


def test_variants_are_the_shapes_sensitivity_names_at_the_named_or_given_seed():
    assert sensitivity_traces("gen:mix", 3) == sensitivity_names("mix", 3)
    assert sensitivity_traces("gen:mix:seed=1", 3) == sensitivity_names("mix", 1)
    assert sensitivity_traces("gen:mix", 0)[0] == "gen:mix:seed=0,burst_factor=2"


@pytest.mark.parametrize(
    ("trace", "error", "words"),
    [
        ("gen:mix:burst_s=10", ValueError, "burst_s=10"),
        ("mooncake-conversation", ValueError, "mooncake-conversation"),
        ("gen:nope", KeyError, "nope"),
    ],
)
def test_a_trace_that_has_no_variants_is_refused_by_name(trace, error, words):
    with pytest.raises(error, match=words):
        sensitivity_traces(trace, 0)


def test_folder_names_keep_the_parameters_readable():
    assert folder_name("gen:mix:seed=0,burst_s=10") == "gen_mix_seed_0-burst_s_10"
    assert folder_name("gen:agent:seed=2,call_min_tokens=50,call_max_tokens=130") == (
        "gen_agent_seed_2-call_min_tokens_50-call_max_tokens_130"
    )


def test_rows_compare_each_kvcost_policy_with_its_own_cells_anchors():
    calibration = [{"workers": 4, "load": "80%", "utilisation": 0.79}]
    a = _bench(
        [
            _row("least_loaded", 1.0, 0.05),  # a reference policy: not an anchor, not compared
            _row("preble_e2", 4.0, 0.5),
            _row("lmetric", 5.0, 0.2),
            _row("cost_aware", 3.0, 0.3),
            _row("cost_aware", 9.0, 0.1, load="95%"),  # its cell has no anchor: left out
        ],
        calibration,
    )
    b = _bench([_row("dualmap", 2.0, 0.4), _row("cost_aware", 3.0, 0.4)])
    rows = sensitivity_rows({"a": a, "b": b})
    assert [(r["trace"], r["best_anchor"], r["p99_vs_best_anchor"]) for r in rows] == [
        ("a", "preble_e2", 0.75),
        ("b", "dualmap", 1.5),
    ]
    assert (rows[0]["lowest_anchor_p50_s"], rows[0]["utilisation"]) == (0.2, 0.79)
    assert math.isnan(rows[1]["utilisation"])
    summary = sensitivity_summary(rows)["cost_aware"]
    assert summary == {
        "rows": 2,
        "geomean_p99_vs_best_anchor": pytest.approx(math.sqrt(0.75 * 1.5)),
        "rows_lost": 1,
        "p50_at_or_below_anchors": 1,
    }


def test_levels_that_share_a_rate_scale_count_once():
    both = _bench([_row("dualmap", 2.0, 0.4), _row("cost_aware", 3.0, 0.4)])
    both["results"] += [_row("dualmap", 2.0, 0.4, load="95%"), _row("cost_aware", 3.0, 0.4, load="95%")]
    rows = sensitivity_rows({"a": both})
    assert len(rows) == 2
    assert sensitivity_summary(rows)["cost_aware"]["rows"] == 1


def test_every_variant_is_benched_in_its_own_folder_and_summarised(tmp_path, monkeypatch):
    calls = []

    def fake_bench(trace, *, out, **_):
        calls.append((trace, out))
        return _bench([_row("preble_e2", 2.0, 0.5), _row("cost_aware", 1.0, 0.5)])

    monkeypatch.setattr(sensitivity, "execute_bench", fake_bench)
    result = sensitivity.execute_sensitivity(
        "gen:mix", sizes=[4], policies=["preble_e2", "cost_aware"], quick=True, seed=0, jobs=1, out=tmp_path
    )
    assert [c[0] for c in calls] == sensitivity_names("mix", 0)
    assert calls[0][1] == tmp_path / "gen_mix_seed_0-burst_factor_2"
    written = json.loads((tmp_path / "sensitivity.json").read_text())
    assert written["summary"]["cost_aware"]["rows"] == 6
    assert written["summary"]["cost_aware"]["geomean_p99_vs_best_anchor"] == 0.5
    assert result["summary"] == written["summary"]
    assert "0.500 over 6 rows; 0 lost" in (tmp_path / "sensitivity.md").read_text()
