"""The ``sklearn`` term predictor: scikit-learn's histogram gradient boosting, L1 loss.

``sklearn.ensemble.HistGradientBoostingRegressor`` (the LightGBM-style
histogram algorithm, Ke et al., NeurIPS 2017) learns the term directly in
seconds. The loss is ``absolute_error`` because the terms are evaluated by MAE
and are heavy-tailed (queue 0–100 s): the L1 loss fits the conditional median
and is not pulled by outliers. The ``nominal_*`` features carry the analytic
prior as inputs. Early stopping is off and ``random_state`` fixed, so the same
data gives the same model.

scikit-learn is imported on first construction, not with :mod:`kvcost`.

Security: the model is saved with joblib, i.e. pickle. Loading a pickle runs
arbitrary code, so only load ``model.joblib`` files you (or your training job)
wrote; the manifest records the scikit-learn version, and unpickling under
another version may fail or warn (``InconsistentVersionWarning``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kvcost.models.predictors.base import TERM_PREDICTORS, BaseTermPredictor

if TYPE_CHECKING:
    from sklearn.ensemble import HistGradientBoostingRegressor


@TERM_PREDICTORS.register("sklearn")
class SklearnTermPredictor(BaseTermPredictor):
    """``HistGradientBoostingRegressor(loss="absolute_error")`` on the feature rows, target in seconds.

    Args:
        term: one of :data:`~kvcost.core.composition.TERMS`.
        **params: any ``HistGradientBoostingRegressor`` parameter, overriding :attr:`default_params`.

    Attributes:
        estimator: the fitted ``HistGradientBoostingRegressor`` (None before ``fit``/``load``),
            for MLflow's sklearn flavour.
    """

    name = "sklearn"
    model_file = "model.joblib"
    default_params = {
        "loss": "absolute_error",
        "learning_rate": 0.05,
        "max_iter": 300,
        "max_leaf_nodes": 63,
        "min_samples_leaf": 20,
        "l2_regularization": 0.0,
        "early_stopping": False,
        "random_state": 0,
    }

    def __init__(self, term: str, **params: Any) -> None:
        super().__init__(term, **params)
        self.estimator: HistGradientBoostingRegressor | None = None

    @classmethod
    def _allowed_params(cls) -> set[str]:
        from sklearn.ensemble import HistGradientBoostingRegressor

        return set(HistGradientBoostingRegressor().get_params())

    def _fit(self, x: np.ndarray, y: np.ndarray, w: np.ndarray | None) -> None:
        from sklearn.ensemble import HistGradientBoostingRegressor

        self.estimator = HistGradientBoostingRegressor(**self.params).fit(x, y, sample_weight=w)

    def _predict(self, x: np.ndarray) -> np.ndarray:
        return self.estimator.predict(x)

    def _save_model(self, model_path: Path) -> None:
        import joblib

        joblib.dump(self.estimator, model_path)

    def _load_model(self, model_path: Path) -> None:
        import joblib

        self.estimator = joblib.load(model_path)
