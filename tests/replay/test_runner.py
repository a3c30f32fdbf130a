"""Tests for kvcost.replay.runner: the arms, the learned arm's model source, input checks, the benchmark's policies."""

import json
import logging
import re

import pytest
from typer.testing import CliRunner

from kvcost.cli import app
from kvcost.replay.experiment import configure
from kvcost.replay.online import OnlineSettings
from kvcost.replay.runner import (
    LearnedSetup,
    _learned_model,
    bench_policies,
    experiment_arms,
    parse_rate_scales,
    prepare,
)
from kvcost.routing.router import RouterSettings

runner = CliRunner()


def _prepare(tmp_path, **overrides):
    options = {
        "workers": 2,
        "fleet": None,
        "slowdowns": (),
        "start_s": 0.0,
        "duration_s": 20.0,
        "rate_scale": 0.55,
        "skip_bad_lines": False,
        "out": tmp_path / "out",
        "db": tmp_path / "log.duckdb",
    }
    return prepare("mooncake-conversation", **{**options, **overrides})


def test_experiment_arms_are_the_five_configurations_and_the_learned_arm_on_request():
    assert [(a.name, a.policy, a.cache_enabled, a.tiered, a.eviction_policy) for a in experiment_arms()] == [
        ("balanced_nocache", "least_loaded", False, False, None),
        ("balanced_cache", "least_loaded", True, False, None),
        ("cost_aware", "cost_aware", True, False, None),
        ("cost_aware_tiered", "cost_aware", True, True, None),
        ("cost_aware_evicting", "cost_aware", True, False, "cost_aware"),
    ]
    # workers that already evict by cost_aware: the evicting arm would repeat cost_aware
    assert [a.name for a in experiment_arms(eviction_policy="cost_aware")] == [a.name for a in experiment_arms()[:4]]
    learned = experiment_arms(learned=True)
    assert [a.name for a in learned[:5]] == [a.name for a in experiment_arms()]
    assert (learned[5].name, learned[5].policy, learned[5].cache_enabled) == (
        "learned_cost_aware",
        "learned_cost_aware",
        True,
    )


def test_learned_model_with_an_empty_registry_falls_back_and_says_so(tmp_path, caplog):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with caplog.at_level(logging.WARNING, logger="kvcost.replay.runner"):
        model, note = _learned_model(LearnedSetup(mlflow_uri=uri))
    assert model is None
    assert note == f"fallback to analytic: no kvcost-terms version with alias 'champion' at {uri}"
    assert [r.getMessage() for r in caplog.records if r.name == "kvcost.replay.runner"] == [
        f"learned_cost_aware falls back to the analytic model: no kvcost-terms version with alias 'champion' at {uri}"
    ]


def test_learned_model_online_names_the_retraining_period():
    model, note = _learned_model(LearnedSetup(online=OnlineSettings(retrain_every_s=120.0)))
    assert model is None
    assert note == "online: analytic at start, LightGBM retrained every 120 s"


def test_experiment_learned_with_an_empty_registry_runs_and_says_it_fell_back(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "out"
    args = ["experiment", "--duration-s", "20", "--learned", "--mlflow-uri", uri]
    result = runner.invoke(app, [*args, "--out", str(out), "--db", str(tmp_path / "log.duckdb")])
    assert result.exit_code == 0, result.output
    message = f"fallback to analytic: no kvcost-terms version with alias 'champion' at {uri}"
    assert f"learned_cost_aware: {message}" in " ".join(result.output.split())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["learned_model"] == message
    assert sorted(summary["configs"]) == [
        "balanced_cache",
        "balanced_nocache",
        "cost_aware",
        "cost_aware_evicting",
        "cost_aware_tiered",
        "learned_cost_aware",
    ]
    # no champion: the learned arm routes exactly as cost_aware does
    assert summary["configs"]["learned_cost_aware"] == summary["configs"]["cost_aware"]
    assert summary["attribution"]["learned_gain_p99_s"] == 0.0


def test_prepare_refuses_a_warmup_past_the_last_arrival_and_an_out_that_is_a_file(tmp_path):
    with pytest.raises(ValueError, match=r"warmup_s = 1e\+06, expected less than the last arrival \("):
        _prepare(tmp_path, warmup_s=1e6)
    with pytest.raises(ValueError, match="^tensor_parallel = 3: expected an integer >= 1 dividing the 64 attention"):
        _prepare(tmp_path, model="llama-3-70b", tensor_parallel=3)  # before any replay starts
    with pytest.raises(ValueError, match="^model = 'llama-3.1-405b' leaves no KV capacity on l40s"):
        _prepare(tmp_path, model="llama-3.1-405b", fleet="l40s:2")
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="^db = '.*file' cannot be opened: .*file is not a DuckDB database file"):
        _prepare(tmp_path, db=tmp_path / "file")  # before any replay starts
    with pytest.raises(ValueError, match="out = '.*file' is a file, expected a folder"):
        _prepare(tmp_path, out=tmp_path / "file")
    spec = _prepare(tmp_path)
    assert (spec.config.workers, spec.out, spec.db) == (2, tmp_path / "out", tmp_path / "log.duckdb")
    assert not spec.out.exists()  # nothing is written before execute


def test_bench_policies_default_order_and_unknown_name():
    assert bench_policies(None) == [
        "round_robin",
        "least_loaded",
        "sglang_cache_aware",
        "dynamo_kv",
        "llmd_default",
        "aibrix_prefix_cache",
        "preble_e2",
        "mooncake_conductor",
        "lmetric",
        "dualmap",
        "llmd_predicted_latency",
        "cost_aware",
        "learned_cost_aware",
        "oracle",
    ]
    assert bench_policies(["oracle", "cost_aware"]) == ["oracle", "cost_aware"]
    message = "^policies = 'cost_aware,nope': unknown router policy 'nope'; expected one of: aibrix_prefix_cache"
    with pytest.raises(ValueError, match=message):
        bench_policies(["cost_aware", "nope"])


def test_parse_rate_scales_maps_each_size_to_the_three_load_levels():
    assert parse_rate_scales("4=0.55,0.71,1; 8=0.92,1.19,2", [8]) == {8: {"60%": 0.92, "80%": 1.19, "95%": 2.0}}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("4=0.5,x", "--rate-scales entry '4=0.5,x', expected"),
        ("4=0.5,0.7", "--rate-scales entry '4=0.5,0.7', expected"),
        ("4=0.5,0,1", "--rate-scales entry '4=0.5,0,1', expected"),
        ("8=0.5,0.7,1", "--rate-scales = '8=0.5,0.7,1' has no entry for sizes [4], expected"),
    ],
)
def test_parse_rate_scales_names_the_bad_entry(text, message):
    with pytest.raises(ValueError, match="^" + re.escape(message.replace("--rate-scales", "rate_scales"))):
        parse_rate_scales(text, [4])


def test_router_options_reach_every_arm(tmp_path):
    assert _prepare(tmp_path).config.router == RouterSettings()  # in-flight prefixes on, skew limit off
    spec = _prepare(tmp_path, count_in_flight=False, count_promise_survival=False, max_share_over_mean=1.0)
    arm = configure(spec.config, experiment_arms()[2])
    router = arm.router
    assert (router.policy, router.count_in_flight, router.count_promise_survival, router.max_share_over_mean) == (
        "cost_aware",
        False,
        False,
        1.0,
    )
