"""The term-predictor contract, run over every registered implementation (river's estimator-check habit).

Every test is parametrised over ``TERM_PREDICTORS.names()``, so a newly
registered predictor is checked without editing this file.
"""

import json

import numpy as np
import pytest

from kvcost.core.composition import TERMS
from kvcost.features.spec import FEATURE_NAMES, feature_spec_hash
from kvcost.models.predictors import (
    TERM_PREDICTORS,
    FeatureSpecMismatch,
    load_term_predictor,
    make_term_predictor,
)
from kvcost.models.predictors.base import MANIFEST_FILE

from .synthetic import queue_target_s, synthetic_features

NAMES = TERM_PREDICTORS.names()
CASES = [(name, term) for name in NAMES for term in ("queue", "prefill", "transfer")]


def target_for(term: str, x: np.ndarray) -> np.ndarray:
    """A non-trivial non-negative target per term (transfer: all zero, as logged today)."""
    if term == "transfer":
        return np.zeros(x.shape[0])
    return queue_target_s(x) if term == "queue" else 1.5 * x[:, FEATURE_NAMES.index(f"nominal_{term}_s")]


def fitted(name: str, term: str, x: np.ndarray):
    return make_term_predictor(name, term).fit(x, target_for(term, x))


@pytest.fixture(scope="session")
def shared_fit(tiny_features):
    """``shared_fit(name, term)``: one predictor per case fitted on ``tiny_features`` with default params,
    shared by the tests that only predict with it or save it (they must not refit or change it)."""
    cache = {}

    def get(name: str, term: str):
        if (name, term) not in cache:
            cache[name, term] = fitted(name, term, tiny_features)
        return cache[name, term]

    return get


def test_registry_names_are_the_permanent_three():
    assert NAMES == ["analytic", "lightgbm", "sklearn"]


@pytest.mark.parametrize("name", NAMES)
def test_class_name_matches_registered_name_and_construction_is_config_only(name):
    predictor = make_term_predictor(name, "queue")
    assert TERM_PREDICTORS.get(name).name == name == predictor.name
    assert predictor.term == "queue"
    assert json.loads(json.dumps(predictor.params)) == predictor.params


@pytest.mark.parametrize(("name", "term"), CASES)
def test_predict_many_shape_nonnegative_finite(name, term, tiny_features, shared_fit):
    predictor = shared_fit(name, term)
    y = predictor.predict_many(tiny_features)
    assert y.dtype == np.float64
    assert y.shape == (tiny_features.shape[0],)
    assert np.isfinite(y).all()
    assert (y >= 0).all()
    assert predictor.predict_many(tiny_features[:0]).shape == (0,)
    assert predictor.predict_many(tiny_features[:1]).shape == (1,)


@pytest.mark.parametrize(("name", "term"), CASES)
def test_predictions_are_clipped_at_zero(name, term, tiny_features, shared_fit):
    # A negative nominal value or an extrapolating model must never give a negative time.
    x = np.array(tiny_features)
    x[:, FEATURE_NAMES.index("nominal_queue_s")] = -5.0
    x[:, FEATURE_NAMES.index("nominal_prefill_s")] = -5.0
    assert (shared_fit(name, term).predict_many(x) >= 0).all()


@pytest.mark.parametrize("name", NAMES)
def test_does_not_mutate_inputs(name, tiny_features):
    x = np.array(tiny_features)
    y = queue_target_s(x)
    w = np.linspace(0.5, 1.5, x.shape[0])
    x0, y0, w0 = x.copy(), y.copy(), w.copy()
    predictor = make_term_predictor(name, "queue").fit(x, y, sample_weight=w)
    predictor.predict_many(x)
    assert np.array_equal(x, x0) and np.array_equal(y, y0) and np.array_equal(w, w0)
    predictor.predict_many(tiny_features)  # read-only input is accepted (writing to it would raise)


@pytest.mark.parametrize(("name", "term"), CASES)
def test_deterministic(name, term, tiny_features, shared_fit):
    # a second fit, possibly after other fits in this process, predicts the same bytes as the first
    first = shared_fit(name, term).predict_many(tiny_features)
    second = fitted(name, term, tiny_features).predict_many(tiny_features)
    assert np.array_equal(first, second)


@pytest.mark.parametrize(("name", "term"), CASES)
def test_fit_returns_self_and_accepts_sample_weight(name, term, tiny_features):
    predictor = make_term_predictor(name, term)
    weights = np.ones(tiny_features.shape[0])
    assert predictor.fit(tiny_features, target_for(term, tiny_features), sample_weight=weights) is predictor
    assert predictor.fitted


@pytest.mark.parametrize(("name", "term"), CASES)
def test_save_load_round_trip(name, term, tiny_features, tmp_path, shared_fit):
    predictor = shared_fit(name, term)
    predictor.save(tmp_path / "p")
    for loaded in (load_term_predictor(tmp_path / "p"), TERM_PREDICTORS.get(name).load(tmp_path / "p")):
        assert type(loaded) is type(predictor)
        assert (loaded.name, loaded.term, loaded.params, loaded.fitted) == (name, term, predictor.params, True)
        assert np.array_equal(loaded.predict_many(tiny_features), predictor.predict_many(tiny_features))


@pytest.mark.parametrize("name", NAMES)
def test_manifest_contents(name, tmp_path, shared_fit):
    predictor = shared_fit(name, "queue")
    predictor.save(tmp_path)
    manifest = json.loads((tmp_path / MANIFEST_FILE).read_text())
    assert manifest["name"] == name
    assert manifest["term"] == "queue"
    assert manifest["feature_spec_hash"] == feature_spec_hash()
    assert manifest["feature_names"] == list(FEATURE_NAMES)
    assert manifest["params"] == predictor.params
    assert manifest["fitted"] is True
    assert set(manifest["library_versions"]) == {"numpy", "sklearn", "lightgbm"}
    assert manifest["library_versions"]["numpy"] == np.__version__
    files = sorted(p.name for p in tmp_path.iterdir())
    model_file = TERM_PREDICTORS.get(name).model_file
    assert files == sorted([MANIFEST_FILE] + ([model_file] if model_file else []))


@pytest.mark.parametrize("name", NAMES)
def test_load_under_another_feature_spec_raises(name, tmp_path, shared_fit):
    shared_fit(name, "queue").save(tmp_path)
    manifest_path = tmp_path / MANIFEST_FILE
    manifest = json.loads(manifest_path.read_text())
    manifest["feature_spec_hash"] = "0123456789abcdef"
    manifest_path.write_text(json.dumps(manifest))
    expected = (
        f"{tmp_path}: trained with feature spec 0123456789abcdef, this kvcost uses {feature_spec_hash()}; "
        "retrain (kvcost train)"
    )
    for load in (load_term_predictor, TERM_PREDICTORS.get(name).load):
        with pytest.raises(FeatureSpecMismatch) as info:
            load(tmp_path)
        assert str(info.value) == expected
        assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("name", NAMES)
def test_predict_before_fit(name, tiny_features):
    """Learned predictors raise RuntimeError before fit; analytic (the prior) is usable as constructed."""
    predictor = make_term_predictor(name, "queue")
    if TERM_PREDICTORS.get(name).needs_fit:
        assert not predictor.fitted
        with pytest.raises(RuntimeError, match=f"^{name} queue predictor is not fitted; call fit"):
            predictor.predict_many(tiny_features)
    else:
        assert predictor.fitted
        before = predictor.predict_many(tiny_features)
        after = predictor.fit(tiny_features, queue_target_s(tiny_features)).predict_many(tiny_features)
        assert np.array_equal(before, after)


@pytest.mark.parametrize("name", NAMES)
def test_unfitted_save_load_stays_unfitted(name, tiny_features, tmp_path):
    make_term_predictor(name, "lookup").save(tmp_path)
    loaded = load_term_predictor(tmp_path)
    assert loaded.fitted == (not TERM_PREDICTORS.get(name).needs_fit)


@pytest.mark.parametrize("name", NAMES)
def test_rejects_bad_shapes_and_values(name, tiny_features):
    predictor = make_term_predictor(name, "queue")
    y = queue_target_s(tiny_features)
    with pytest.raises(ValueError, match=rf"features must have shape \(n, {len(FEATURE_NAMES)}\)"):
        predictor.fit(tiny_features[:, :-1], y)
    with pytest.raises(ValueError, match=r"target_s must have shape \(64,\)"):
        predictor.fit(tiny_features, y[:-1])
    with pytest.raises(ValueError, match="target_s must be finite and ≥ 0"):
        predictor.fit(tiny_features, -y)
    with pytest.raises(ValueError, match="sample_weight must be finite and ≥ 0"):
        predictor.fit(tiny_features, y, sample_weight=np.full(64, np.nan))
    with pytest.raises(ValueError, match="sample_weight is all zero"):
        predictor.fit(tiny_features, y, sample_weight=np.zeros(64))
    with pytest.raises(ValueError, match="cannot fit on 0 rows"):
        predictor.fit(tiny_features[:0], y[:0])
    predictor.fit(tiny_features, y)
    n = len(FEATURE_NAMES)
    with pytest.raises(ValueError, match=rf"features must have shape \(n, {n}\) in FEATURE_NAMES order; got \({n},\)"):
        predictor.predict_many(tiny_features[0])


def test_unknown_name_lists_registered_names():
    with pytest.raises(
        KeyError, match="unknown term predictor 'xgboost'; expected one of: analytic, lightgbm, sklearn"
    ):
        make_term_predictor("xgboost", "queue")


@pytest.mark.parametrize("name", NAMES)
def test_unknown_term_names_it_and_the_terms(name):
    with pytest.raises(ValueError) as info:
        make_term_predictor(name, "decode")
    assert str(info.value) == f"unknown term 'decode'; expected one of: {', '.join(TERMS)}"


@pytest.mark.parametrize("name", NAMES)
def test_unknown_parameter_is_an_error(name):
    with pytest.raises(ValueError, match=f"unknown {name} predictor parameter\\(s\\) no_such_param"):
        make_term_predictor(name, "queue", no_such_param=1)


def test_load_without_manifest_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"{tmp_path}: no predictor.json; not a saved term predictor"):
        load_term_predictor(tmp_path)


@pytest.mark.parametrize("name", NAMES)
def test_load_of_another_kind_is_refused(name, tmp_path, shared_fit):
    shared_fit(name, "queue").save(tmp_path)
    other = next(n for n in NAMES if n != name)
    with pytest.raises(ValueError, match=f"holds a '{name}' term predictor, not '{other}'"):
        TERM_PREDICTORS.get(other).load(tmp_path)


def test_fitted_manifest_without_model_file_is_a_clear_error(tmp_path, shared_fit):
    shared_fit("lightgbm", "queue").save(tmp_path)
    (tmp_path / "model.txt").unlink()
    with pytest.raises(FileNotFoundError, match="manifest says fitted but model.txt is missing"):
        load_term_predictor(tmp_path)


def test_synthetic_rows_are_deterministic():
    assert np.array_equal(synthetic_features(16, seed=3), synthetic_features(16, seed=3))
