"""Tests for kvcost.core.engine_profile (fitting a measured engine, and loading it as a GPU type)."""

import json

import pytest

from kvcost.core.engine_profile import EngineProfile, fit_engine_profile, relative_errors
from tests.helpers import MEASURED_STEP as TRUE
from tests.helpers import measured_points as measured
from tests.helpers import measured_profile as profile


def test_the_fit_recovers_the_step_that_made_the_points():
    prefill, decode = measured()
    fit = fit_engine_profile(prefill, decode)
    p_err, d_err = relative_errors(fit, prefill, decode)
    assert p_err.max() < 1e-6 and d_err.max() < 1e-6
    assert fit.overhead_s == pytest.approx(TRUE.overhead_s, rel=1e-3)
    assert fit.s_per_attention_pair == pytest.approx(TRUE.s_per_attention_pair, rel=1e-3)
    assert fit.first_token_s == pytest.approx(TRUE.first_token_s, rel=1e-3)


def test_the_step_time_model_of_a_profile_reproduces_its_fit():
    model = profile().step_time_model()
    # a prefill of 512 tokens in one step; a decode step of 8 sequences of 56 tokens
    assert model.prefill_alone_s(512) == pytest.approx(float(TRUE.step_s(512, 512 * 513 / 2, 0.0)), rel=1e-9)
    assert model.step_s(8, 0.0, 8 * 56) == pytest.approx(float(TRUE.step_s(8, 0.0, 448)), rel=1e-9)
    assert model.gpu.name == "cpu-tiny" and model.token_budget == 2048
    assert model.kv_capacity_blocks(16) == 100


def test_a_profile_round_trips_and_a_bad_file_is_named(tmp_path):
    path = profile().save(tmp_path / "p.json")
    assert EngineProfile.load(path) == profile()
    (tmp_path / "old.json").write_text(json.dumps({"version": 0}))
    with pytest.raises(ValueError, match=r"version = 0, expected 1"):
        EngineProfile.load(tmp_path / "old.json")
    (tmp_path / "partial.json").write_text(json.dumps({"version": 1, "name": "x"}))
    with pytest.raises(ValueError, match="expected the keys kvcost profile writes"):
        EngineProfile.load(tmp_path / "partial.json")
    with pytest.raises(FileNotFoundError, match="expected one written by kvcost profile"):
        EngineProfile.load(tmp_path / "absent.json")


def test_too_few_points_or_a_nonpositive_time_are_refused():
    prefill, decode = measured()
    with pytest.raises(ValueError, match="2 prefill and 6 decode points, expected at least 3 and 2"):
        fit_engine_profile(prefill[:2], decode)
    prefill[0, 1] = -1e-3
    with pytest.raises(ValueError, match="round trip exceeded the request"):
        fit_engine_profile(prefill, decode)
