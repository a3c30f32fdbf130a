"""Per-term predictors, registered by name in :data:`TERM_PREDICTORS`.

Importing this package registers every implementation: ``analytic`` (the
profile-based prior), ``sklearn`` (HistGradientBoostingRegressor) and
``lightgbm`` (a LightGBM booster). scikit-learn and LightGBM themselves are
imported only when such a predictor is first constructed, fitted or loaded.
"""

from kvcost.models.predictors import analytic, lightgbm, sklearn  # noqa: F401  (importing registers them)
from kvcost.models.predictors.base import (
    TERM_PREDICTORS,
    BaseTermPredictor,
    FeatureSpecMismatch,
    TermPredictor,
    load_term_predictor,
    make_term_predictor,
)

__all__ = [
    "TERM_PREDICTORS",
    "BaseTermPredictor",
    "FeatureSpecMismatch",
    "TermPredictor",
    "load_term_predictor",
    "make_term_predictor",
]
