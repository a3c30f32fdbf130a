"""A complete learned cost model: one predictor per term plus the calibration of the composed TTFT.

``predict(features)`` gives the per-term seconds (:class:`TermPredictions`);
``calibrate(predictions)`` maps the composed TTFT through the isotonic
recalibration and adds split-conformal P50 / P90 upper bounds. The set is
saved as one folder (``manifest.json`` + one sub-folder per term predictor +
the calibrators as JSON) so that it can be registered in MLflow as one model
version, and refuses to load under another feature-spec hash.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvcost.calibration.conformal import SplitConformal
from kvcost.calibration.isotonic import IsotonicCalibrator
from kvcost.core.composition import TERMS, CalibratedTTFT, TermPredictions
from kvcost.features.spec import feature_spec_hash
from kvcost.models.predictors import FeatureSpecMismatch, TermPredictor, load_term_predictor, make_term_predictor


@dataclass
class TermModelSet:
    """Per-term predictors + calibrators + metadata (feature-spec hash, data window, metrics).

    Attributes:
        predictors: one fitted predictor per term in TERMS.
        isotonic: recalibration of the composed TTFT (None = identity).
        conformal: split-conformal bounds on the recalibrated TTFT (None = no bounds: p90 = NaN).
        metadata: JSON-serialisable facts (``feature_spec_hash`` is always set).
    """

    predictors: dict[str, TermPredictor]
    isotonic: IsotonicCalibrator | None = None
    conformal: SplitConformal | None = None
    metadata: dict = field(default_factory=dict)

    name = "learned"

    def __post_init__(self) -> None:
        missing = [t for t in TERMS if t not in self.predictors]
        if missing:
            raise ValueError(f"predictors lacks term(s) {missing}, expected one per term of {list(TERMS)}")
        self.metadata.setdefault("feature_spec_hash", feature_spec_hash())

    @classmethod
    def analytic(cls) -> TermModelSet:
        """The analytic cost model: every term from its profile-based ``nominal_*`` feature, no calibration."""
        return cls({t: make_term_predictor("analytic", t) for t in TERMS}, metadata={"predictor": "analytic"})

    @property
    def learned(self) -> bool:
        """True when any term predictor is learned (not ``analytic``)."""
        return any(p.name != "analytic" for p in self.predictors.values())

    @property
    def calibrated(self) -> bool:
        """True when the set serves calibrated P50 / P90 scores: a learned set, or analytic terms whose
        TTFT was calibrated on logged rows (online learning's gate keeps those when the analytic
        model predicts better than the learned one)."""
        return self.learned or self.conformal is not None

    def predict(self, features: np.ndarray) -> TermPredictions:
        """Per-term predictions, seconds, each ``(n,)``."""
        return TermPredictions(**{f"{t}_s": self.predictors[t].predict_many(features) for t in TERMS})

    def calibrate(self, predictions: TermPredictions) -> CalibratedTTFT:
        """Recalibrated TTFT (P50 score) and its conformal P90 upper bound."""
        ttft_s = predictions.ttft_s
        p50_s = self.isotonic.transform(ttft_s) if self.isotonic is not None else ttft_s
        if self.conformal is None:
            return CalibratedTTFT(p50_s, np.full_like(p50_s, np.nan))
        bounds = self.conformal.upper_bounds(p50_s)
        return CalibratedTTFT(p50_s, bounds[0.9])

    def save(self, path: str | Path) -> Path:
        """Write the set into folder ``path`` (created); returns it."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        for term, predictor in self.predictors.items():
            predictor.save(path / term)
        manifest = {
            "metadata": self.metadata,
            "terms": {t: p.name for t, p in self.predictors.items()},
            "isotonic": self.isotonic.to_dict() if self.isotonic is not None else None,
            "conformal": self.conformal.to_dict() if self.conformal is not None else None,
        }
        (path / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
        return path

    @classmethod
    def load(cls, path: str | Path) -> TermModelSet:
        """Read a saved set.

        Raises:
            FileNotFoundError: no ``manifest.json`` in ``path``.
            FeatureSpecMismatch: trained under another feature-spec hash (message names both hashes).
        """
        path = Path(path)
        manifest_path = path / "manifest.json"
        if not manifest_path.exists():
            raise FileNotFoundError(f"{path}: no manifest.json, expected a folder written by TermModelSet.save")
        manifest = json.loads(manifest_path.read_text())
        saved = manifest["metadata"].get("feature_spec_hash")
        if saved != feature_spec_hash():
            raise FeatureSpecMismatch(path, saved, feature_spec_hash())
        predictors = {t: load_term_predictor(path / t) for t in manifest["terms"]}
        isotonic = IsotonicCalibrator.from_dict(manifest["isotonic"]) if manifest["isotonic"] else None
        conformal = SplitConformal.from_dict(manifest["conformal"]) if manifest["conformal"] else None
        return cls(predictors, isotonic, conformal, manifest["metadata"])
