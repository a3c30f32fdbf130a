"""MLflow "models from code" entry point for a :class:`~kvcost.models.term_set.TermModelSet`.

MLflow executes this file when it loads the registered model ``kvcost-terms``
as a pyfunc; kvcost itself never imports it (``set_model`` at the bottom is
the models-from-code contract, see mlflow.org "Models From Code"). The model's
input is a DataFrame of feature rows (FEATURE_NAMES columns); its output has
one column per term (seconds) plus ``ttft_s``, ``ttft_p50_s`` and ``ttft_p90_s``.
"""

import mlflow
import pandas as pd

from kvcost.core.composition import TERMS
from kvcost.features.spec import FEATURE_NAMES
from kvcost.models.term_set import TermModelSet


class TermSetPyfunc(mlflow.pyfunc.PythonModel):
    """Pyfunc wrapper: loads the term set from the ``term_set`` artifact."""

    def load_context(self, context) -> None:
        self.model_set = TermModelSet.load(context.artifacts["term_set"])

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        features = model_input.loc[:, list(FEATURE_NAMES)].to_numpy(dtype=float)
        predictions = self.model_set.predict(features)
        calibrated = self.model_set.calibrate(predictions)
        out = {f"{t}_s": getattr(predictions, f"{t}_s") for t in TERMS}
        out |= {"ttft_s": predictions.ttft_s, "ttft_p50_s": calibrated.p50_s, "ttft_p90_s": calibrated.p90_s}
        return pd.DataFrame(out)


mlflow.models.set_model(TermSetPyfunc())
