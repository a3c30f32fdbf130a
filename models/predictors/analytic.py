"""The ``analytic`` term predictor: the profile-based nominal time of its term, unlearned.

For term ``t`` it returns the feature column ``nominal_<t>_s`` (computed by
:mod:`kvcost.features.nominal` from the GPU type's measured operator profile
and the queued work), clipped to ≥ 0. Every term has such a column in today's spec (``nominal_transfer_s``
is 0 unless the router plans a fetch); a spec without one predicts 0 s.

It is the prior that the learned predictors improve on (they see the same
``nominal_*`` columns as inputs), so it needs no training: it is usable as
constructed, and ``fit`` is a no-op that returns ``self``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from kvcost.features.spec import FEATURE_INDEX
from kvcost.models.predictors.base import TERM_PREDICTORS, BaseTermPredictor


def nominal_column(term: str, index: Mapping[str, int] = FEATURE_INDEX) -> int | None:
    """Column of ``nominal_<term>_s`` in the feature rows, or None when the spec has none."""
    return index.get(f"nominal_{term}_s")


@TERM_PREDICTORS.register("analytic")
class AnalyticTermPredictor(BaseTermPredictor):
    """Reads ``nominal_<term>_s``; zeros when the feature spec has no such column.

    Example
    -------
    >>> import numpy as np
    >>> from kvcost.features.spec import FEATURE_INDEX, FEATURE_NAMES
    >>> x = np.zeros((2, len(FEATURE_NAMES)))
    >>> x[:, FEATURE_INDEX["nominal_prefill_s"]] = [0.18, 0.015]
    >>> AnalyticTermPredictor("prefill").predict_many(x).tolist()
    [0.18, 0.015]
    >>> AnalyticTermPredictor("transfer").predict_many(x).tolist()
    [0.0, 0.0]
    """

    name = "analytic"
    needs_fit = False

    def __init__(self, term: str, **params: object) -> None:
        super().__init__(term, **params)  # takes no parameters: any raises ValueError
        self._column = nominal_column(self.term)

    def _fit(self, x: np.ndarray, y: np.ndarray, w: np.ndarray | None) -> None:
        """Nothing to learn: the analytic model is the prior."""

    def _predict(self, x: np.ndarray) -> np.ndarray:
        if self._column is None:
            return np.zeros(x.shape[0])
        return x[:, self._column]
