"""The ``lightgbm`` term predictor: a LightGBM booster with L1 objective, fast small-batch predict.

Trained with ``lightgbm.train`` (not the scikit-learn wrapper) on the feature
rows, target in seconds; the ``nominal_*`` features carry the analytic prior
as inputs. Objective ``l1``: the terms are evaluated by MAE and are
heavy-tailed (queue 0–100 s); L1 fits the conditional median, is not pulled by
outliers and, unlike ``huber``, has no threshold in seconds to tune per term
(a Huber ``alpha`` that suits a 0–100 s queue is pure L2 for a 2 ms
first-token term). A log1p target did no better, so the target stays in
seconds.

Residual target (``residual_of_nominal``, default True): a term with an
analytic prior among the features (``nominal_<term>_s``, every term in today's
spec) is learned as ``actual − nominal`` and predicted as ``nominal + booster``;
a term without one would be learned as is.
Trees predict piecewise constants and cannot extrapolate, while the queue and
prefill grow with the work ahead far past the loads seen in training; the
prior carries that growth and the booster learns the correction (KV-admission
waits, stragglers, jitter), which lowered the TTFT MAE on the conversation
trace's log. The booster alone (MLflow's lightgbm flavour) then predicts the
correction; the term set and its pyfunc add the prior. Training is
deterministic (``deterministic=True``, ``force_row_wise=True``, fixed
``seed``).

The router calls :meth:`LightGBMTermPredictor.predict_many` once per decision
with ≤ 32 rows, so its cost is dominated by per-call overhead.
``Booster.predict`` rebuilds a Python predictor object per call; instead the
fitted booster is evaluated with one direct ``LGBM_BoosterPredictForMat`` call
(one thread, all iterations), the same C function ``Booster.predict`` ends in,
so the values are identical. If a LightGBM release renames the private symbols
this uses, it falls back to ``Booster.predict(X, num_threads=1)``.

Defaults: 150 rounds at learning rate 0.1, 31 leaves, LightGBM's
``min_data_in_leaf`` of 20: on the conversation trace's log larger settings
matched them in accuracy at a higher scoring latency, and a larger
``min_data_in_leaf`` helped the default fleet but hurt a heterogeneous
straggler fleet.

Measured figures behind each choice above (objective, target, residual,
booster size): ``docs/term-models.md``.

Saved as LightGBM's text model format (``model.txt``): no pickle, readable
across LightGBM versions. LightGBM is imported on first fit/load, not with
:mod:`kvcost`.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kvcost.features.spec import FEATURE_INDEX, FEATURE_NAMES
from kvcost.models.predictors.base import TERM_PREDICTORS, BaseTermPredictor

if TYPE_CHECKING:
    import lightgbm

#: C API constants (LightGBM ``c_api.h``).
_C_API_DTYPE_FLOAT64 = 1
_C_API_IS_ROW_MAJOR = 1
_C_API_PREDICT_NORMAL = 0
_PREDICT_PARAMETER = ctypes.c_char_p(b"num_threads=1")


@TERM_PREDICTORS.register("lightgbm")
class LightGBMTermPredictor(BaseTermPredictor):
    """A ``lightgbm.Booster`` (``objective="l1"``) on the feature rows, target in seconds.

    Args:
        term: one of :data:`~kvcost.core.composition.TERMS`.
        **params: LightGBM training parameters overriding :attr:`default_params`, plus
            ``num_boost_round``; an unknown name raises ``ValueError``.
            ``num_threads`` applies to training only; prediction uses one thread.

    Attributes:
        booster: the fitted ``lightgbm.Booster`` (None before ``fit``/``load``), for
            MLflow's lightgbm flavour.
    """

    name = "lightgbm"
    model_file = "model.txt"
    default_params = {
        "objective": "l1",
        "learning_rate": 0.1,
        "num_boost_round": 150,
        "num_leaves": 31,
        "min_data_in_leaf": 20,
        "feature_fraction": 1.0,
        "bagging_fraction": 1.0,
        "lambda_l2": 0.0,
        "num_threads": 2,
        "deterministic": True,
        "force_row_wise": True,
        "seed": 0,
        "verbosity": -1,
        "residual_of_nominal": True,
    }

    def __init__(self, term: str, **params: Any) -> None:
        super().__init__(term, **params)
        self.booster: lightgbm.Booster | None = None
        self._predict_for_mat = None

    @classmethod
    def _allowed_params(cls) -> set[str] | None:
        """LightGBM's parameter names and aliases plus ``num_boost_round`` (LightGBM itself ignores
        unknown names silently at ``verbosity=-1``); None, accepting any, if that list is unavailable."""
        try:
            from lightgbm.basic import _ConfigAliases

            aliases = _ConfigAliases._get_all_param_aliases()
        except (ImportError, AttributeError):
            return None
        return (
            {"num_boost_round", "residual_of_nominal"}
            | set(aliases)
            | {alias for names in aliases.values() for alias in names}
        )

    def _fit(self, x: np.ndarray, y: np.ndarray, w: np.ndarray | None) -> None:
        import lightgbm

        params = dict(self.params)
        num_boost_round = int(params.pop("num_boost_round"))
        params.pop("residual_of_nominal")
        prior = self._prior_column()
        label = y - x[:, prior] if prior is not None else y
        data = lightgbm.Dataset(x, label=label, weight=w, feature_name=list(FEATURE_NAMES), params=params)
        self._set_booster(lightgbm.train(params, data, num_boost_round=num_boost_round))

    def _prior_column(self) -> int | None:
        """Column of ``nominal_<term>_s`` when the target is the residual over it, else None."""
        if not self.params.get("residual_of_nominal", False):
            return None
        return FEATURE_INDEX.get(f"nominal_{self.term}_s")

    def _predict(self, x: np.ndarray) -> np.ndarray:
        prior = self._prior_column()
        out = self._predict_booster(x)
        return out + x[:, prior] if prior is not None else out

    def _predict_booster(self, x: np.ndarray) -> np.ndarray:
        if self._predict_for_mat is None:
            return self.booster.predict(x, num_threads=1)
        x = np.ascontiguousarray(x)
        out = np.empty(x.shape[0])
        out_len = ctypes.c_int64(0)
        self._check_call(
            self._predict_for_mat(
                self._handle,
                ctypes.c_void_p(x.ctypes.data),
                _C_API_DTYPE_FLOAT64,
                x.shape[0],
                x.shape[1],
                _C_API_IS_ROW_MAJOR,
                _C_API_PREDICT_NORMAL,
                0,
                -1,
                _PREDICT_PARAMETER,
                ctypes.byref(out_len),
                ctypes.c_void_p(out.ctypes.data),
            )
        )
        if out_len.value != x.shape[0]:
            raise RuntimeError(f"LightGBM returned {out_len.value} predictions for {x.shape[0]} rows")
        return out

    def _save_model(self, model_path: Path) -> None:
        self.booster.save_model(str(model_path), num_iteration=-1)

    def _load_model(self, model_path: Path) -> None:
        import lightgbm

        self._set_booster(lightgbm.Booster(model_file=str(model_path)))

    def _set_booster(self, booster: lightgbm.Booster) -> None:
        """Keep ``booster`` and bind the direct C predict call (None if the private API is unavailable)."""
        self.booster = booster
        self._predict_for_mat = None
        try:
            from lightgbm.basic import _LIB, _safe_call

            function = _LIB.LGBM_BoosterPredictForMat
            handle = booster._handle
        except (ImportError, AttributeError):
            return
        self._check_call = _safe_call
        self._handle = handle
        self._predict_for_mat = function
