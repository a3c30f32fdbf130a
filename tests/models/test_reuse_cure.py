"""The mixture cure reuse model: recovers known parameters under censoring, exact probabilities,
classes, fitting from idle periods, save/load and bad input."""

import math

import numpy as np
import pandas as pd
import pytest

from kvcost.models.reuse_cure import (
    MIN_OBSERVED_REUSES,
    CureReuseModel,
    fit_cure,
    reused_share_class,
)


def synthetic_gaps(n: int, pi: float, mu: float, sigma: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A share ``pi`` of blocks is reused after a log-normal gap, the rest never; logs end after U(0, 3000) s."""
    rng = np.random.default_rng(seed)
    gap = np.where(rng.uniform(size=n) < pi, np.exp(rng.normal(mu, sigma, n)), np.inf)
    follow_up = rng.uniform(0, 3000, n)
    observed = gap <= follow_up
    return np.where(observed, gap, follow_up), observed


def test_fit_recovers_cure_fraction_and_gap_distribution_under_censoring():
    gap, observed = synthetic_gaps(20_000, pi=0.3, mu=5.0, sigma=1.0, seed=0)
    assert observed.mean() < 0.3  # censoring hides part of the reuses
    pi, mu, sigma = fit_cure(gap, observed)
    assert abs(pi - 0.3) < 0.02 and abs(mu - 5.0) < 0.05 and abs(sigma - 1.0) < 0.05


def test_probability_exact_values():
    # π 0.5, gap median 100 s (μ = ln 100), σ 1, H 100 s: at idle 0, P = 0.5 · F(100) = 0.25;
    # at idle 100 s, P = 0.5 (Φ(ln 2) − 0.5) / (1 − 0.5 · 0.5) = 0.5 · 0.255891 / 0.75 = 0.170594
    model = CureReuseModel(100.0, [(0.5, math.log(100.0), 1.0)] * 4)
    p = model.probability(np.array([0, 3]), np.array([0.0, 100.0]))
    assert p.round(6).tolist() == [0.25, 0.170594]
    assert CureReuseModel(100.0, [(0.0, 1.0, 1.0)] * 4).probability(np.array([1]), np.array([5.0])).tolist() == [0.0]


def test_reused_share_classes():
    assert reused_share_class(np.array([0, 1, 2, 5, 8, 9, 12]), np.array([10] * 7)).tolist() == [0, 0, 1, 2, 3, 3, 3]
    assert reused_share_class(np.array([3]), np.array([0])).tolist() == [3]  # share clipped to 1


def test_fit_from_idle_periods_censors_at_the_log_end_and_pools_thin_classes():
    rng = np.random.default_rng(1)
    gap, observed = synthetic_gaps(4_000, pi=0.4, mu=4.0, sigma=0.8, seed=2)
    idle_t = rng.uniform(0, 100, gap.size)
    end_s = 3100.0
    periods = pd.DataFrame(
        {
            "idle_t_s": idle_t,
            "next_demand_s": np.where(observed, idle_t + gap, np.inf),
            "reused_blocks": np.where(np.arange(gap.size) < 3_000, 0, 9),  # classes 0 and 3
            "request_blocks": 10,
        }
    )
    model = CureReuseModel.fit(periods, end_s=end_s, horizon_s=60.0)
    assert model.params[1] == model.params[2]  # no rows: the pooled fit
    assert model.params[1] != model.params[0]
    pi, mu, _ = model.params[0]
    assert abs(pi - 0.4) < 0.05 and abs(mu - 4.0) < 0.1
    thin = periods.iloc[3_000 : 3_000 + MIN_OBSERVED_REUSES - 1].assign(next_demand_s=0.0)
    assert CureReuseModel.fit(pd.concat([periods.iloc[:3_000], thin]), end_s, 60.0).params[3] == fit_cure(
        *_gaps(pd.concat([periods.iloc[:3_000], thin]), end_s)
    )


def _gaps(periods: pd.DataFrame, end_s: float) -> tuple[np.ndarray, np.ndarray]:
    observed = periods["next_demand_s"].to_numpy() <= end_s
    return np.where(observed, periods["next_demand_s"], end_s) - periods["idle_t_s"], observed


def test_save_load_round_trip_and_refusals(tmp_path):
    model = CureReuseModel(42.0, [(0.2, 5.0, 1.0), (0.1, 5.3, 0.9), (0.3, 5.7, 1.1), (0.6, 5.5, 1.6)])
    loaded = CureReuseModel.load(model.save(tmp_path / "m"))
    assert (loaded.horizon_s, loaded.params) == (model.horizon_s, model.params)
    (tmp_path / "m" / "cure.json").write_text('{"horizon_s": 1, "reused_share_edges": [0.5], "params": []}')
    with pytest.raises(ValueError, match=r"reused_share_edges = \[0.5\], this kvcost uses \[0.2, 0.5, 0.8\]"):
        CureReuseModel.load(tmp_path / "m")
    with pytest.raises(FileNotFoundError, match="no cure.json"):
        CureReuseModel.load(tmp_path / "empty")


def test_bad_input_names_the_field():
    with pytest.raises(ValueError, match="horizon_s = 0"):
        CureReuseModel(0, [(0.5, 1.0, 1.0)] * 4)
    with pytest.raises(ValueError, match="params has 2 classes, expected 4"):
        CureReuseModel(1.0, [(0.5, 1.0, 1.0)] * 2)
    with pytest.raises(ValueError, match=r"params\[1\] = \(π 1.5, σ 1.0\)"):
        CureReuseModel(1.0, [(0.5, 1.0, 1.0), (1.5, 1.0, 1.0), (0.5, 1.0, 1.0), (0.5, 1.0, 1.0)])
    with pytest.raises(ValueError, match="none of 2 gaps is observed"):
        fit_cure(np.array([1.0, 2.0]), np.array([False, False]))
    with pytest.raises(ValueError, match="periods is empty"):
        CureReuseModel.fit(pd.DataFrame(columns=["idle_t_s", "next_demand_s"]), 1.0, 1.0)
