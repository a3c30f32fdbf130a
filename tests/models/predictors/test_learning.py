"""The learned predictors recover a known relation that the analytic prior misses.

Synthetic log: actual queue_s = 0.8 × nominal_queue_s + 0.002 s × waiting_requests
+ N(0, 10 ms), over heavy-tailed queues (mean 4.2 s, max 55 s). 4,000 rows train,
2,000 held out. Measured holdout MAE: lightgbm 0.072 s, sklearn 0.087 s, analytic 1.04 s;
the holdout target's mean absolute deviation is 3.34 s, so the 10 % tolerance is 0.33 s.
"""

import numpy as np
import pytest

from kvcost.models.predictors import make_term_predictor

from .synthetic import queue_target_s, synthetic_features

N_TRAIN = 4000


@pytest.fixture(scope="module")
def queue_log():
    x = synthetic_features(N_TRAIN + 2000, seed=0)
    y = queue_target_s(x, seed=1)
    return x[:N_TRAIN], y[:N_TRAIN], x[N_TRAIN:], y[N_TRAIN:]


def holdout_mae_s(name: str, queue_log) -> float:
    x_train, y_train, x_holdout, y_holdout = queue_log
    predictor = make_term_predictor(name, "queue").fit(x_train, y_train)
    return float(np.mean(np.abs(predictor.predict_many(x_holdout) - y_holdout)))


@pytest.mark.parametrize("name", ["lightgbm", "sklearn"])
def test_learned_predictor_recovers_the_queue_relation(name, queue_log):
    y_holdout = queue_log[3]
    mad_s = float(np.mean(np.abs(y_holdout - np.median(y_holdout))))
    learned_s = holdout_mae_s(name, queue_log)
    analytic_s = holdout_mae_s("analytic", queue_log)
    assert learned_s < 0.1 * mad_s, f"{name} holdout MAE {learned_s:.3f} s ≥ 10 % of MAD {mad_s:.3f} s"
    assert learned_s <= 0.5 * analytic_s, f"{name} {learned_s:.3f} s vs analytic {analytic_s:.3f} s"
