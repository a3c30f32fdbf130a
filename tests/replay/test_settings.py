"""Tests for kvcost.replay.settings: the replay options' table and the default rate scale."""

import math
from pathlib import Path

import pytest
from pydantic import ValidationError

from kvcost.replay.eviction_study import StudySettings
from kvcost.replay.settings import DEFAULT_RATE_SCALE, ReplaySettings, parse_policy_params


def test_prepare_arguments_are_the_runner_keywords():
    settings = ReplaySettings(slowdown=["1:0.6@600"], workers=2)
    assert settings.prepare_arguments() == {
        "trace": "mooncake-conversation",
        "workers": 2,
        "fleet": None,
        "rate_scale": 0.55,
        "start_s": 0.0,
        "duration_s": None,
        "seed": 0,
        "warmup_s": 0.0,
        "directory_lag_s": 0.0,
        "slowdowns": ("1:0.6@600",),
        "token_budget": 8192,
        "tensor_parallel": 1,
        "profiles": (),
        "model": "llama-3-8b",
        "kv_capacity_blocks": None,
        "gpu_memory_utilization": 0.9,
        "jitter_sigma": 0.05,
        "eviction_policy": "lru",
        "count_in_flight": True,
        "count_promise_survival": True,
        "max_share_over_mean": math.inf,
        "policy_params": (),
        "skip_bad_lines": False,
        "out": None,
        "db": Path("runs/kvcost.duckdb"),
    }


def test_every_replay_study_defaults_to_the_one_rate_scale():
    assert DEFAULT_RATE_SCALE == 0.55
    assert ReplaySettings().rate_scale == StudySettings().rate_scale == DEFAULT_RATE_SCALE


def test_policy_params_are_name_value_pairs_in_order():
    settings = ReplaySettings(policy_param=["duplicate_price_weight=0", " hold_tokens = 64.5"])
    assert settings.policy_params == (("duplicate_price_weight", 0.0), ("hold_tokens", 64.5))
    assert settings.prepare_arguments()["policy_params"] == settings.policy_params
    assert parse_policy_params([]) == ()


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("duplicate_price_weight", "policy_param = 'duplicate_price_weight', expected NAME=VALUE with a number"),
        ("=1", "policy_param = '=1', expected NAME=VALUE with a number"),
        ("hold_tokens=many", "policy_param = 'hold_tokens=many', expected NAME=VALUE with a number"),
        ("hold_tokens=nan", "policy_param = 'hold_tokens=nan', expected NAME=VALUE with a number"),
    ],
)
def test_a_bad_policy_param_names_the_entry(entry, message):
    with pytest.raises(ValueError, match=message):
        parse_policy_params([entry])
    with pytest.raises(ValidationError, match=message):
        ReplaySettings(policy_param=[entry])


def test_a_policy_param_given_twice_is_refused():
    with pytest.raises(ValueError, match="policy_param 'hold_tokens' given twice, expected each parameter once"):
        parse_policy_params(["hold_tokens=1", "hold_tokens=2"])
