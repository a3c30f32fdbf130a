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
