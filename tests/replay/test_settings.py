"""Tests for kvcost.replay.settings: the replay options' table and the default rate scale."""

import math
from pathlib import Path

from kvcost.replay.eviction_study import StudySettings
from kvcost.replay.settings import DEFAULT_RATE_SCALE, ReplaySettings


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
        "skip_bad_lines": False,
        "out": None,
        "db": Path("runs/kvcost.duckdb"),
    }


def test_every_replay_study_defaults_to_the_one_rate_scale():
    assert DEFAULT_RATE_SCALE == 0.55
    assert ReplaySettings().rate_scale == StudySettings().rate_scale == DEFAULT_RATE_SCALE
