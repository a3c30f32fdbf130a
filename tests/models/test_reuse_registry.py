"""The reuse-model registry: names, files, a duplicate name, loading by the saved file, fitting from a log."""

import pytest

from kvcost.models.reuse import (
    REUSE_MODELS,
    RecencyPrior,
    ReuseClassifier,
    idle_periods,
    load_reuse_model,
    reuse_training_frame,
    saved_reuse_model,
)
from kvcost.models.reuse_cure import CureReuseModel
from tests.models.test_reuse import EVENTS, synthetic


def test_the_registry_holds_prior_lightgbm_and_cure_with_their_files():
    assert REUSE_MODELS.items() == [("prior", RecencyPrior), ("lightgbm", ReuseClassifier), ("cure", CureReuseModel)]
    assert [(m.name, m.saved_file) for _, m in REUSE_MODELS.items()] == [
        ("prior", None),
        ("lightgbm", "manifest.json"),
        ("cure", "cure.json"),
    ]


def test_a_duplicate_reuse_model_name_is_an_error_and_an_unknown_one_lists_the_known():
    with pytest.raises(ValueError, match="duplicate reuse model name 'cure': already registered"):
        REUSE_MODELS.add("cure", ReuseClassifier)
    assert REUSE_MODELS.get("cure") is CureReuseModel
    with pytest.raises(KeyError, match="unknown reuse model 'xgb'; expected one of: cure, lightgbm, prior"):
        REUSE_MODELS.get("xgb")


def test_a_saved_model_is_recognised_by_its_file(tmp_path):
    CureReuseModel(30.0, [(0.2, 5.0, 1.0)] * 4).save(tmp_path / "cure")
    ReuseClassifier(60.0, num_threads=1).fit(synthetic(1_000, seed=3)).save(tmp_path / "lightgbm")
    (tmp_path / "empty").mkdir()
    assert saved_reuse_model(tmp_path / "cure") is CureReuseModel
    assert saved_reuse_model(tmp_path / "lightgbm") is ReuseClassifier
    assert saved_reuse_model(tmp_path / "empty") is None
    cure, lightgbm = load_reuse_model(tmp_path / "cure"), load_reuse_model(tmp_path / "lightgbm")
    assert (type(cure), cure.horizon_s, type(lightgbm), lightgbm.horizon_s) == (
        CureReuseModel,
        30.0,
        ReuseClassifier,
        60.0,
    )
    with pytest.raises(FileNotFoundError) as err:
        load_reuse_model(tmp_path / "empty")
    assert str(err.value) == (
        f"{tmp_path / 'empty'}: neither manifest.json nor cure.json, expected a folder saved by a reuse model "
        "(kvcost eviction-study writes one per cache size: OUT/reuse_models/fraction_*)"
    )


def test_from_log_fits_each_model_or_returns_none_when_the_log_cannot_support_it():
    frame = reuse_training_frame(EVENTS, horizon_s=10.0, size_bytes=64.0, seed=0, samples_per_idle=1, end_s=40.0)
    assert frame["label"].tolist() == [1, 0, 0]
    assert RecencyPrior.from_log(EVENTS, frame, 10.0, 40.0) is None
    assert ReuseClassifier.from_log(EVENTS, frame[frame["label"] == 0], 10.0, 40.0) is None  # one label class
    # the first demand after an idle moment is at 5 s: a log ending at 4 s has no reuse to fit
    assert CureReuseModel.from_log(EVENTS, frame, 10.0, 4.0) is None
    fitted = CureReuseModel.from_log(EVENTS, frame, 10.0, 40.0)
    expected = CureReuseModel.fit(idle_periods(EVENTS), 40.0, 10.0)
    assert (fitted.horizon_s, fitted.params) == (10.0, expected.params)
