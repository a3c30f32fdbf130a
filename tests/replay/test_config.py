"""Tests for kvcost.replay.config (ClusterConfig validation, --fleet and --slowdown parsing)."""

import math

import pytest

from kvcost.replay.config import ClusterConfig, Slowdown, parse_fleet, parse_slowdown


def error(exc_type, fn, *args, **kwargs) -> str:
    with pytest.raises(exc_type) as err:
        fn(*args, **kwargs)
    return str(err.value)


def test_parse_fleet():
    assert parse_fleet("a100:2,h100:2", 4) == ("a100", "a100", "h100", "h100")
    assert parse_fleet(" h100 , a100 : 2 ", 3) == ("h100", "a100", "a100")  # count defaults to 1
    assert parse_fleet(None, 3) == ("a100", "a100", "a100")
    assert parse_fleet("h100:3", 0) == ("h100",) * 3  # workers 0: no total to check


def test_parse_fleet_errors():
    assert error(ValueError, parse_fleet, "v100:2", 2) == (
        "fleet GPU 'v100', expected one of a100, a100-40gb, b200, h100, h100-pcie, h200, l40s, mi300x"
    )
    assert error(ValueError, parse_fleet, "a100:0", 0) == "fleet count = 0, expected an integer ≥ 1"
    for bad in ("a100:-1", "a100:x", "a100:2:1", ""):
        assert error(ValueError, parse_fleet, bad, 0) == (f"fleet item {bad!r}, expected GPU[:COUNT] such as 'a100:2'")
    assert error(ValueError, parse_fleet, "a100:2,,h100", 0) == ("fleet item '', expected GPU[:COUNT] such as 'a100:2'")
    assert error(ValueError, parse_fleet, "a100:2,h100:1", 4) == (
        "fleet 'a100:2,h100:1' has 3 workers, expected --workers 4"
    )
    assert error(ValueError, parse_fleet, "a100:3", 2) == "fleet 'a100:3' has 3 workers, expected --workers 2"


def test_parse_slowdown():
    assert parse_slowdown("1:2.5@600") == Slowdown(worker_id=1, speed_fraction=2.5, from_s=600.0)
    assert parse_slowdown("0:3") == Slowdown(0, 3.0, 0.0)
    assert parse_slowdown(" 2 : 1.5 @ 1e2 ") == Slowdown(2, 1.5, 100.0)


def test_parse_slowdown_errors():
    for bad in ("x:2", "1", "1:", "1:2@", "-1:2", "1:2 600", "1:2@600s"):
        assert error(ValueError, parse_slowdown, bad) == (
            f"slowdown {bad!r}, expected WORKER:SPEED[@T_S] such as '1:0.6@600'"
        )
    for bad in ("1:2.5.1", "1:2@6-0", "1:e"):
        assert error(ValueError, parse_slowdown, bad) == (f"slowdown {bad!r}, expected numbers in WORKER:SPEED[@T_S]")
    assert error(ValueError, parse_slowdown, "1:2@-5") == "slowdown start = -5.0, expected a time ≥ 0 s"


def test_non_positive_factor_is_rejected_by_parser_and_config():
    assert error(ValueError, parse_slowdown, "1:0") == "slowdown speed fraction = 0.0, expected a number > 0"
    slow = Slowdown(1, 0.0)
    assert error(ValueError, ClusterConfig, slowdowns=(slow,)) == (
        "slowdown speed fraction = 0.0, expected a number > 0"
    )


def test_cluster_config_defaults():
    config = ClusterConfig()
    assert config.workers == 4 and config.fleet == ("a100",) * 4
    assert config.kv_capacity_blocks is None and config.cache_enabled
    assert ClusterConfig(fleet=("h100", "a100"), kv_capacity_blocks=1).workers == 2


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("token_budget", 0, "token_budget = 0, expected an integer ≥ 1"),
        ("kv_capacity_blocks", 0, "kv_capacity_blocks = 0, expected an integer ≥ 1"),
        ("directory_lag_s", -0.5, "directory_lag_s = -0.5, expected a number ≥ 0"),
        ("directory_lag_s", math.nan, "directory_lag_s = nan, expected a number ≥ 0"),
        ("jitter_sigma", -0.1, "jitter_sigma = -0.1, expected a number ≥ 0"),
        ("sample_interval_s", 0.0, "sample_interval_s = 0.0, expected a number > 0"),
        ("warmup_s", -1.0, "warmup_s = -1.0, expected a number ≥ 0"),
        ("fleet", (), "fleet is empty, expected at least one worker"),
        ("slowdowns", (Slowdown(4, 2.0),), "slowdown worker = 4, expected a worker index in [0, 3]"),
        ("slowdowns", (Slowdown(-1, 2.0),), "slowdown worker = -1, expected a worker index in [0, 3]"),
        ("slowdowns", (Slowdown(0, -2.0),), "slowdown speed fraction = -2.0, expected a number > 0"),
        ("slowdowns", (Slowdown(0, math.inf),), "slowdown speed fraction = inf, expected a number > 0"),
    ],
)
def test_cluster_config_validation_names_field_and_value(field, value, message):
    assert error(ValueError, ClusterConfig, **{field: value}) == message


def test_cluster_config_unknown_model_or_gpu():
    assert error(ValueError, ClusterConfig, model="gpt-5").startswith(
        "model = 'gpt-5', expected one of llama-2-70b, llama-2-7b, llama-3-70b, llama-3-8b,"
    )
    assert error(ValueError, ClusterConfig, model="gpt-5").endswith("or a path to a config.json")
    assert error(KeyError, ClusterConfig, fleet=("a100", "v100")) == (
        "\"unknown gpu 'v100'; expected one of: a100, a100-40gb, b200, h100, h100-pcie, h200, l40s, mi300x\""
    )


def test_a_measured_profile_is_a_gpu_type_of_the_fleet(tmp_path):
    from tests.helpers import measured_profile as profile

    path = str(profile().save(tmp_path / "cpu-tiny.json"))
    assert parse_fleet("cpu-tiny:2,a100", 3, ("cpu-tiny",)) == ("cpu-tiny", "cpu-tiny", "a100")
    config = ClusterConfig(fleet=("cpu-tiny", "a100"), profiles=(path,), token_budget=1024)
    measured = config.step_model("cpu-tiny")
    assert (measured.gpu.name, measured.token_budget, measured.step_overhead_s) == ("cpu-tiny", 1024, 2e-3)
    assert config.step_model("a100").gpu.name == "a100"
    with pytest.raises(KeyError, match="unknown gpu 'cpu-tiny'"):
        ClusterConfig(fleet=("cpu-tiny",))
