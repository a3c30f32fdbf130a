"""Tests for kvcost.serving.settings: ServiceSettings read ``KVCOST_*`` environment variables."""

from pathlib import Path

import pytest
from pydantic import ValidationError

from kvcost.serving.settings import ServiceSettings


def test_an_environment_variable_sets_a_field_and_a_keyword_wins(monkeypatch):
    monkeypatch.setenv("KVCOST_PORT", "9000")
    monkeypatch.setenv("kvcost_max_decisions", "7")  # case-insensitive
    monkeypatch.setenv("KVCOST_KV_EVENTS", '["0=tcp://10.0.0.5:5557"]')
    settings = ServiceSettings()
    assert (settings.port, settings.max_decisions, settings.kv_events) == (9000, 7, ["0=tcp://10.0.0.5:5557"])
    assert settings.db_path == Path("runs/kvcost.duckdb")
    assert ServiceSettings(port=9100).port == 9100


def test_a_bad_environment_variable_is_a_validation_error_of_its_field(monkeypatch):
    monkeypatch.setenv("KVCOST_PORT", "70000")
    with pytest.raises(ValidationError) as info:
        ServiceSettings()
    assert [(e["loc"], e["input"]) for e in info.value.errors()] == [(("port",), "70000")]


def test_gateway_engines_and_lora_modules_are_parsed_and_bad_entries_name_the_field(tmp_path):
    from kvcost.serving.settings import parse_engine

    assert parse_engine("1=http://10.0.0.5:8000/") == (1, "http://10.0.0.5:8000")
    settings = ServiceSettings(engines=["0=http://e0:8000"], lora_modules=["sql=/adapters/sql"], tokenizer=tmp_path)
    assert settings.lora_paths() == {"sql": "/adapters/sql"}
    bad = [
        ({"engines": ["0=e0:8000"]}, "engines entry '0=e0:8000', expected WORKER=http://HOST:PORT"),
        ({"engines": ["0=http://a:1", "0=http://b:1"]}, "engines names worker ids [0, 0]"),
        ({"lora_modules": ["sql"]}, "lora_modules entry 'sql', expected NAME=PATH"),
        ({"lora_modules": ["a=/x", "a=/y"]}, "lora_modules entry 'a=/y', expected NAME=PATH (each name once)"),
        ({"tokenizer": tmp_path / "none"}, f"tokenizer = '{tmp_path / 'none'}' is not a folder"),
        ({"hash_extra_keys": "tags"}, "Input should be 'tagged' or 'bare'"),
        ({"model": "llama-3-70b", "tensor_parallel": 3}, "tensor_parallel = 3: expected an integer >= 1"),
    ]
    for fields, message in bad:
        with pytest.raises(ValidationError) as info:
            ServiceSettings(**fields)
        assert message in str(info.value)


def test_a_sqlite_store_in_a_missing_folder_is_refused_at_start(tmp_path):
    uri = f"sqlite:///{tmp_path}/nowhere/mlflow.db"
    with pytest.raises(ValueError, match=r"mlflow_uri = .*nowhere/mlflow.db': the folder .* does not exist"):
        ServiceSettings(mlflow_uri=uri)
    assert ServiceSettings(mlflow_uri=f"sqlite:///{tmp_path}/mlflow.db").mlflow_uri.endswith("mlflow.db")
    assert ServiceSettings(mlflow_uri="sqlite:///runs/mlflow.db").mlflow_uri == "sqlite:///runs/mlflow.db"
    assert not (tmp_path / "nowhere").exists()


def test_a_profile_file_adds_its_gpu_type_to_the_services_step_models(tmp_path):
    from kvcost.serving.model_loading import default_step_models
    from tests.helpers import measured_profile as profile

    path = profile().save(tmp_path / "cpu-tiny.json")
    models = default_step_models("llama-3-8b", 1, [path])
    assert models["cpu-tiny"].step_overhead_s == 2e-3 and "h200" in models and "a100" in models


def test_the_default_gpu_may_be_a_profiles(tmp_path):
    from tests.helpers import measured_profile as profile

    path = profile().save(tmp_path / "cpu-tiny.json")
    settings = ServiceSettings(db_path=tmp_path / "log.duckdb", profile=[path], gpu_default="cpu-tiny")
    assert settings.gpu_default == "cpu-tiny"
    with pytest.raises(ValueError, match="gpu_default = 'cpu-tiny', expected one of a100"):
        ServiceSettings(db_path=tmp_path / "log.duckdb", gpu_default="cpu-tiny")
