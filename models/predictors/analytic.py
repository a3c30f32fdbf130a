"""The ``analytic`` term predictor: the profile-based nominal time of its term, unlearned.

For term ``t`` it returns the feature column ``nominal_<t>_s`` (computed by
:mod:`kvcost.features.nominal` from the GPU type's measured operator profile
and the queued work), plus, for the queue, the KV-wait estimate (:data:`ADDED_COLUMNS`),
clipped to ≥ 0. Every term has such a column in today's spec (``nominal_transfer_s``
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

ADDED_COLUMNS: Mapping[str, tuple[str, ...]] = {"queue": ("kv_wait_estimate_s",)}
"""Feature columns the analytic model adds to a term's ``nominal_<term>_s``, by term.

The queue: ``nominal_queue_s`` is the compute queue, the prefill chunks ahead of the request
(:func:`~kvcost.features.nominal.queue_and_prefill_s`); the queue a request waits also holds the
wait for the KV memory its admission needs, which ``kv_wait_estimate_s`` estimates beyond the compute
queue (:func:`~kvcost.features.nominal.kv_wait_s`). Why it should hold on other workloads: it is 0
wherever the worker has the memory for the work queued ahead and the request, so it moves nothing
there; where memory is short, a worker admits its queue as its decoders free memory, which a count
of prefill tokens does not see, and the estimate is read from the snapshot and the GPU's profile
with nothing fitted. Measured for kvcost issue 13 where memory binds (L40S workers:
``docs/routing-sensitivity.md``, "The KV wait beyond one drain of the running batch") and on the A100
grid, three seeds (``docs/routing-unseen-workloads.md``, "The KV wait in ``cost_aware``'s queue on the
grid").

The LightGBM terms keep ``nominal_<term>_s`` alone as the prior of their residual
(:mod:`~kvcost.models.predictors.lightgbm`): they see the estimate as a feature and learn how much of
it the queue shows.
"""


def nominal_column(term: str, index: Mapping[str, int] = FEATURE_INDEX) -> int | None:
    """Column of ``nominal_<term>_s`` in the feature rows, or None when the spec has none."""
    return index.get(f"nominal_{term}_s")


def added_columns(term: str, index: Mapping[str, int] = FEATURE_INDEX) -> list[int]:
    """Columns of the term's :data:`ADDED_COLUMNS` that the feature rows have, in that order."""
    return [index[name] for name in ADDED_COLUMNS.get(term, ()) if name in index]


@TERM_PREDICTORS.register("analytic")
class AnalyticTermPredictor(BaseTermPredictor):
    """Reads ``nominal_<term>_s`` (the queue: plus ``kv_wait_estimate_s``, :data:`ADDED_COLUMNS`); zeros
    when the feature spec has no ``nominal_<term>_s``.

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
        self._added = added_columns(self.term)

    def _fit(self, x: np.ndarray, y: np.ndarray, w: np.ndarray | None) -> None:
        """Nothing to learn: the analytic model is the prior."""

    def _predict(self, x: np.ndarray) -> np.ndarray:
        if self._column is None:
            return np.zeros(x.shape[0])
        if not self._added:
            return x[:, self._column]
        return x[:, self._column] + x[:, self._added].sum(axis=1)
