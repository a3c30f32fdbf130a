"""The per-term predictor interface, its registry, and the save/load manifest they share.

A term predictor learns one TTFT term (:data:`~kvcost.core.composition.TERMS`:
queue, lookup, transfer, prefill, first_token) in seconds from feature rows
(:data:`~kvcost.features.spec.FEATURE_SPEC`). The contract is small
(one contract test suite runs over every implementation): ``fit``, ``predict_many``, ``save`` / ``load``, a registry
``name`` and the ``term``. Implementations are registered by permanent name in
:data:`TERM_PREDICTORS` and share :class:`BaseTermPredictor`, which owns input
validation, the fitted check, clipping and the on-disk layout::

    <dir>/predictor.json   manifest: name, term, feature_spec_hash, feature_names,
                           params, library_versions, fitted
    <dir>/<model file>     the implementation's model (e.g. model.txt), when fitted

A saved predictor refuses to load under another feature spec
(:class:`FeatureSpecMismatch`; docs/architecture.md §3, "One feature schema").

Example
-------
>>> import numpy as np
>>> from kvcost.features.spec import FEATURE_INDEX, FEATURE_NAMES
>>> x = np.zeros((2, len(FEATURE_NAMES)))
>>> x[:, FEATURE_INDEX["nominal_queue_s"]] = [0.25, -1.0]
>>> make_term_predictor("analytic", "queue").predict_many(x).tolist()
[0.25, 0.0]
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar, Protocol, Self

import numpy as np

from kvcost.core.composition import TERMS
from kvcost.core.registry import Registry
from kvcost.features.spec import FEATURE_NAMES, feature_spec_hash

#: File name of the manifest inside a saved predictor's directory.
MANIFEST_FILE = "predictor.json"
#: Distributions whose versions are recorded in the manifest (model files depend on them).
_VERSIONED_DISTRIBUTIONS = {"numpy": "numpy", "sklearn": "scikit-learn", "lightgbm": "lightgbm"}
_MANIFEST_KEYS = ("name", "term", "feature_spec_hash", "feature_names", "params", "library_versions", "fitted")

TERM_PREDICTORS: Registry[type] = Registry("term predictor")


class FeatureSpecMismatch(ValueError):  # noqa: N818  (the name is part of the public API)
    """A saved predictor was trained under another feature spec than this kvcost's."""

    def __init__(self, path: Path, saved: str, current: str) -> None:
        super().__init__(
            f"{path}: trained with feature spec {saved}, this kvcost uses {current}; retrain (kvcost train)"
        )
        self.path = path
        self.saved = saved
        self.current = current


class TermPredictor(Protocol):
    """Predicts one TTFT term, in seconds, for each feature row.

    Attributes:
        name: the permanent registry name (``"analytic"``, ``"sklearn"``, ``"lightgbm"``).
        term: the term it predicts, one of :data:`TERMS`.
    """

    name: str
    term: str

    def fit(self, features: np.ndarray, target_s: np.ndarray, sample_weight: np.ndarray | None = None) -> Self:
        """Train on float64 ``(n, len(FEATURE_SPEC))`` rows and ``(n,)`` actual seconds ≥ 0; returns ``self``."""
        ...

    def predict_many(self, features: np.ndarray) -> np.ndarray:
        """float64 ``(n,)`` predicted seconds, ≥ 0 and finite, for ``(n, len(FEATURE_SPEC))`` rows."""
        ...

    def save(self, path: Path) -> None:
        """Write the predictor into directory ``path`` (``predictor.json`` + model file)."""
        ...

    @classmethod
    def load(cls, path: Path) -> Self:
        """Read a predictor written by :meth:`save`; raises :class:`FeatureSpecMismatch`."""
        ...


def check_term(term: str) -> str:
    """Return ``term`` if it is one of :data:`TERMS`; raise ``ValueError`` naming it and the terms otherwise."""
    if term not in TERMS:
        raise ValueError(f"unknown term {term!r}; expected one of: {', '.join(TERMS)}")
    return term


def make_term_predictor(name: str, term: str, **params: Any) -> TermPredictor:
    """A fresh, unfitted predictor of kind ``name`` for ``term``, ``params`` overriding its defaults.

    Raises:
        KeyError: unknown ``name``; the message lists the registered names.
        ValueError: unknown ``term`` (the message lists :data:`TERMS`) or unknown parameter.
    """
    return TERM_PREDICTORS.get(name)(term, **params)


def load_term_predictor(path: Path) -> TermPredictor:
    """Load the predictor saved in directory ``path``, dispatching on its manifest's ``name``.

    Raises:
        FileNotFoundError: ``path`` holds no ``predictor.json`` (or a fitted predictor lacks its model file).
        KeyError: the manifest names an unregistered predictor kind.
        FeatureSpecMismatch: trained under another feature spec.
        ValueError: the manifest is malformed.
    """
    manifest = read_manifest(Path(path))
    return TERM_PREDICTORS.get(manifest["name"]).load(path)


def library_versions() -> dict[str, str | None]:
    """Installed versions of the libraries model files depend on (None when not installed)."""
    versions: dict[str, str | None] = {}
    for key, distribution in _VERSIONED_DISTRIBUTIONS.items():
        try:
            versions[key] = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            versions[key] = None
    return versions


def read_manifest(path: Path) -> dict[str, Any]:
    """The parsed ``predictor.json`` of saved-predictor directory ``path``.

    Raises:
        FileNotFoundError: no manifest there.
        ValueError: not JSON, or a required key is missing.
    """
    manifest_path = Path(path) / MANIFEST_FILE
    if not manifest_path.is_file():
        raise FileNotFoundError(
            f"{path}: no {MANIFEST_FILE}; not a saved term predictor (write one with TermPredictor.save)"
        )
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{manifest_path}: not valid JSON ({exc})") from None
    missing = [key for key in _MANIFEST_KEYS if key not in manifest]
    if missing:
        raise ValueError(f"{manifest_path}: missing keys {', '.join(missing)}")
    return manifest


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"parameter value {value!r} of type {type(value).__name__} is not JSON-serialisable")


class BaseTermPredictor(ABC):
    """Shared machinery of the registered term predictors.

    Subclasses set ``name``, ``model_file`` and ``default_params``, and implement
    ``_fit``, ``_predict``, ``_save_model`` and ``_load_model``. The constructor
    is pure: it stores the configuration (``term`` and ``params``, the defaults
    overridden by the caller's); ``fit`` or ``load`` produce a model.

    Thread safety: ``predict_many`` only reads the fitted model and may run from
    several threads at once; ``fit`` and ``load`` must not race with it.

    Attributes:
        name: permanent registry name.
        term: one of :data:`TERMS`.
        params: the full configuration, JSON-serialisable, stored in the manifest.
        needs_fit: False for predictors that are usable as constructed (the analytic prior).
        model_file: file name of the model inside a saved directory; None when there is none.
    """

    name: ClassVar[str]
    needs_fit: ClassVar[bool] = True
    model_file: ClassVar[str | None] = None
    default_params: ClassVar[Mapping[str, Any]] = {}

    def __init__(self, term: str, **params: Any) -> None:
        self.term = check_term(term)
        allowed = self._allowed_params()
        if allowed is not None:
            unknown = sorted(set(params) - set(allowed))
            if unknown:
                known = ", ".join(sorted(allowed)) if len(allowed) <= 20 else f"one of its {len(allowed)} parameters"
                raise ValueError(
                    f"unknown {self.name} predictor parameter(s) {', '.join(unknown)}; expected {known or '(none)'}"
                )
        self.params: dict[str, Any] = {**self.default_params, **params}
        self._fitted = not self.needs_fit

    def __repr__(self) -> str:
        state = "fitted" if self._fitted else "unfitted"
        return f"{type(self).__name__}(term={self.term!r}, {state})"

    @property
    def fitted(self) -> bool:
        """True when ``predict_many`` may be called."""
        return self._fitted

    # -- the contract --------------------------------------------------------------

    def fit(self, features: np.ndarray, target_s: np.ndarray, sample_weight: np.ndarray | None = None) -> Self:
        """Train on logged rows; returns ``self``.

        Args:
            features: float64 ``(n, len(FEATURE_SPEC))``, columns in ``FEATURE_NAMES`` order, n ≥ 1.
            target_s: ``(n,)`` actual seconds of this term, finite and ≥ 0.
            sample_weight: optional ``(n,)`` finite weights ≥ 0, not all zero.

        Raises:
            ValueError: a shape or value is out of range.
        """
        x = _as_features(features)
        if x.shape[0] == 0:
            raise ValueError(f"{self.name} {self.term} predictor: cannot fit on 0 rows")
        y = _as_vector(target_s, x.shape[0], "target_s")
        w = None if sample_weight is None else _as_vector(sample_weight, x.shape[0], "sample_weight")
        if w is not None and not w.any():
            raise ValueError("sample_weight is all zero")
        self._fit(x, y, w)
        self._fitted = True
        return self

    def predict_many(self, features: np.ndarray) -> np.ndarray:
        """Predicted seconds of this term per row.

        Args:
            features: float64 ``(n, len(FEATURE_SPEC))``, columns in ``FEATURE_NAMES`` order
                (other numeric dtypes are converted); not modified.

        Returns:
            float64 ``(n,)``, seconds, clipped to ≥ 0.

        Raises:
            RuntimeError: the predictor needs ``fit`` or ``load`` first.
            ValueError: ``features`` has the wrong shape.
        """
        if not self._fitted:
            raise RuntimeError(f"{self.name} {self.term} predictor is not fitted; call fit() or load() first")
        x = _as_features(features)
        if x.shape[0] == 0:
            return np.zeros(0)
        return np.maximum(self._predict(x), 0.0)

    def save(self, path: Path) -> None:
        """Write into directory ``path`` (created if needed): the model file, then ``predictor.json``.

        The manifest is written last and atomically, so a directory with a
        manifest holds a complete predictor.
        """
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        if self._fitted and self.model_file is not None:
            self._save_model(path / self.model_file)
        manifest = {
            "name": self.name,
            "term": self.term,
            "feature_spec_hash": feature_spec_hash(),
            "feature_names": list(FEATURE_NAMES),
            "params": self.params,
            "library_versions": library_versions(),
            "fitted": self._fitted,
        }
        text = json.dumps(manifest, indent=2, sort_keys=True, default=_json_default) + "\n"
        tmp = path / (MANIFEST_FILE + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path / MANIFEST_FILE)

    @classmethod
    def load(cls, path: Path) -> Self:
        """Read a predictor of this kind written by :meth:`save`.

        Raises:
            FileNotFoundError: no manifest, or a fitted predictor's model file is missing.
            FeatureSpecMismatch: trained under another feature spec than :func:`feature_spec_hash`.
            ValueError: the manifest is malformed or names another kind.
        """
        path = Path(path)
        manifest = read_manifest(path)
        if manifest["name"] != cls.name:
            raise ValueError(
                f"{path}: holds a {manifest['name']!r} term predictor, not {cls.name!r}; use load_term_predictor"
            )
        current = feature_spec_hash()
        if manifest["feature_spec_hash"] != current:
            raise FeatureSpecMismatch(path, manifest["feature_spec_hash"], current)
        predictor = cls(manifest["term"], **manifest["params"])
        if manifest["fitted"] and cls.model_file is not None:
            model_path = path / cls.model_file
            if not model_path.is_file():
                raise FileNotFoundError(f"{path}: manifest says fitted but {cls.model_file} is missing")
            predictor._load_model(model_path)
        predictor._fitted = bool(manifest["fitted"]) or not cls.needs_fit
        return predictor

    # -- implementation hooks ------------------------------------------------------

    @classmethod
    def _allowed_params(cls) -> set[str] | None:
        """Accepted parameter names; None accepts any (validated by the library at fit)."""
        return set(cls.default_params)

    @abstractmethod
    def _fit(self, x: np.ndarray, y: np.ndarray, w: np.ndarray | None) -> None:
        """Train on validated float64 ``x (n, F)``, ``y (n,)``, optional ``w (n,)``."""

    @abstractmethod
    def _predict(self, x: np.ndarray) -> np.ndarray:
        """Raw predictions ``(n,)`` for validated float64 ``x (n ≥ 1, F)``; must not modify ``x``."""

    def _save_model(self, model_path: Path) -> None:  # noqa: B027  (optional hook)
        """Write the fitted model to ``model_path`` (only called when ``model_file`` is set)."""

    def _load_model(self, model_path: Path) -> None:  # noqa: B027  (optional hook)
        """Read the model written by :meth:`_save_model`."""


def _as_features(features: np.ndarray) -> np.ndarray:
    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != len(FEATURE_NAMES):
        raise ValueError(f"features must have shape (n, {len(FEATURE_NAMES)}) in FEATURE_NAMES order; got {x.shape}")
    return x


def _as_vector(values: np.ndarray, n: int, label: str) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64)
    if v.shape != (n,):
        raise ValueError(f"{label} must have shape ({n},); got {v.shape}")
    if not np.isfinite(v).all() or (v < 0).any():
        raise ValueError(f"{label} must be finite and ≥ 0")
    return v
