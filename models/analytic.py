"""The analytic cost model: per-term TTFT predictions from the profile-based features.

Each term is read from the feature row's ``nominal_*`` column, computed by
:mod:`kvcost.features.nominal` from the GPU type's measured operator profile
(Vidur) and the queued work. There is no KV transfer yet, so X = 0.
"""

from __future__ import annotations

import numpy as np

from kvcost.features.spec import FEATURE_INDEX
from kvcost.models.composition import TermPredictions

_COLUMNS = {
    "queue_s": "nominal_queue_s",
    "lookup_s": "nominal_lookup_s",
    "prefill_s": "nominal_prefill_s",
    "first_token_s": "nominal_first_token_s",
}


class AnalyticCostModel:
    """Analytic per-term predictor over a feature matrix.

    ``predict(features)`` takes float64 ``(n_candidates, len(FEATURE_SPEC))`` and
    returns :class:`TermPredictions` (seconds, each ``(n_candidates,)``, ≥ 0).
    """

    name = "analytic"

    def predict(self, features: np.ndarray) -> TermPredictions:
        """Per-term predictions in seconds for each feature row."""
        cols = {term: np.maximum(features[:, FEATURE_INDEX[col]], 0.0) for term, col in _COLUMNS.items()}
        return TermPredictions(transfer_s=np.zeros(features.shape[0]), **cols)
