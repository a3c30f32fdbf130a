"""Tests for kvcost.calibration.conformal (SplitConformal, conformal_rank)."""

import json
import math

import numpy as np
import pytest

from kvcost.calibration.conformal import SplitConformal, conformal_rank

# Nine hand-made scores (multiples of 1/8, exact in binary); sorted:
# -0.25, -0.125, 0, 0.125, 0.25, 0.375, 0.5, 0.75, 1.0
SCORES = np.array([0.5, -0.25, 0.125, 1.0, 0.0, 0.375, -0.125, 0.75, 0.25])


@pytest.mark.parametrize(
    ("level", "rank", "quantile"),
    [
        (0.5, 5, 0.25),  # ⌈10 × 0.5⌉ = 5
        (0.7, 7, 0.5),  # 10 × 0.7 = 7.000000000000001 in floats; still rank 7
        (0.71, 8, 0.75),  # ⌈7.1⌉ = 8
        (0.85, 9, 1.0),  # ⌈8.5⌉ = 9
        (0.9, 9, 1.0),  # ⌈9⌉ = 9
        (0.95, 10, math.inf),  # ⌈9.5⌉ = 10 > n: no finite bound
    ],
)
def test_quantile_is_the_ceil_n_plus_1_alpha_th_smallest_score(level, rank, quantile):
    assert conformal_rank(9, level) == rank
    calibrated = np.full(9, 2.0)
    conf = SplitConformal(levels=(level,), score="absolute").fit(calibrated, calibrated + SCORES)
    assert conf.quantiles == {level: quantile}
    assert conf.n_calibration == 9


def test_absolute_bounds_on_nine_scores():
    calibrated = np.full(9, 2.0)
    conf = SplitConformal(levels=(0.5, 0.9), score="absolute").fit(calibrated, calibrated + SCORES)
    bounds = conf.upper_bounds([1.0, 3.0, 0.0])
    assert list(bounds) == [0.5, 0.9]
    assert bounds[0.5].tolist() == [1.25, 3.25, 0.25]
    assert bounds[0.9].tolist() == [2.0, 4.0, 1.0]


def test_relative_bounds_on_nine_scores_scale_with_the_prediction():
    calibrated = np.array([0.5, 1.0, 2.0, 4.0, 0.25, 0.5, 1.0, 2.0, 4.0])
    conf = SplitConformal(levels=(0.5, 0.9)).fit(calibrated, calibrated * (1.0 + SCORES))
    assert conf.score == "relative" and conf.floor_s == 0.05
    assert conf.quantiles == {0.5: 0.25, 0.9: 1.0}
    bounds = conf.upper_bounds([2.0, 0.5, 0.02])
    # 2 + 0.25 × 2, 0.5 + 0.25 × 0.5; below the floor the width is 0.25 × 0.05 s
    assert bounds[0.5].tolist()[:2] == [2.5, 0.625]
    assert bounds[0.5][2] == pytest.approx(0.02 + 0.0125)
    assert bounds[0.9].tolist()[:2] == [4.0, 1.0]
    assert bounds[0.9][2] == pytest.approx(0.07)


def test_bounds_are_clipped_at_zero():
    calibrated = np.full(9, 2.0)
    conf = SplitConformal(levels=(0.5,), score="absolute").fit(calibrated, calibrated - 1.5)  # q = −1.5
    assert conf.upper_bounds([1.0, 2.0])[0.5].tolist() == [0.0, 0.5]


@pytest.mark.parametrize("score", ["absolute", "relative"])
def test_coverage_on_iid_synthetic_data(score):
    rng = np.random.default_rng(0)
    n = 5000
    # TTFT over three orders of magnitude, multiplicative noise, a few tiny predictions
    calibrated = rng.lognormal(-1.5, 1.2, 2 * n)
    actual = calibrated * rng.lognormal(0.0, 0.4, 2 * n) + rng.exponential(0.01, 2 * n)
    conf = SplitConformal(levels=(0.5, 0.9), score=score).fit(calibrated[:n], actual[:n])
    bounds = conf.upper_bounds(calibrated[n:])
    cov90 = conf.coverage(bounds[0.9], actual[n:])
    cov50 = conf.coverage(bounds[0.5], actual[n:])
    assert 0.88 <= cov90 <= 0.92
    assert 0.47 <= cov50 <= 0.53


def test_too_small_a_calibration_set_gives_an_infinite_bound():
    conf = SplitConformal(levels=(0.5, 0.9), score="absolute").fit([1.0] * 5, [1.0, 1.5, 2.0, 2.5, 3.0])
    # n = 5: ⌈6 × 0.9⌉ = 6 > 5
    assert conf.quantiles == {0.5: 1.0, 0.9: math.inf}
    bounds = conf.upper_bounds([2.0])
    assert bounds[0.5].tolist() == [3.0] and bounds[0.9].tolist() == [math.inf]
    assert conf.coverage(bounds[0.9], [1e6]) == 1.0


def test_coverage_counts_ties_as_covered():
    assert SplitConformal.coverage([1.0, 2.0, 3.0, 4.0], [1.0, 2.5, 3.0, 0.0]) == 0.75


def test_json_round_trip():
    rng = np.random.default_rng(2)
    calibrated = rng.lognormal(-1.0, 1.0, 200)
    actual = calibrated * rng.lognormal(0.0, 0.3, 200)
    for conf in (
        SplitConformal(levels=(0.5, 0.9, 0.999), score="relative", floor_s=0.02).fit(calibrated, actual),
        SplitConformal(score="absolute").fit(calibrated[:5], actual[:5]),  # infinite P90
    ):
        loaded = SplitConformal.from_dict(json.loads(json.dumps(conf.to_dict(), allow_nan=False)))
        assert loaded.quantiles == conf.quantiles
        assert (loaded.levels, loaded.score, loaded.floor_s, loaded.n_calibration) == (
            conf.levels,
            conf.score,
            conf.floor_s,
            conf.n_calibration,
        )
        probe = rng.lognormal(-1.0, 1.5, 100)
        for level, bound in conf.upper_bounds(probe).items():
            assert np.array_equal(loaded.upper_bounds(probe)[level], bound)


def test_config_and_input_errors():
    with pytest.raises(ValueError, match="levels must be in \\(0, 1\\); got 1.0"):
        SplitConformal(levels=(0.5, 1.0))
    with pytest.raises(ValueError, match="score must be one of absolute, relative; got 'squared'"):
        SplitConformal(score="squared")
    with pytest.raises(ValueError, match="floor_s must be finite and > 0 seconds; got 0.0"):
        SplitConformal(floor_s=0.0)
    with pytest.raises(ValueError, match=r"calibrated_s and actual_s must have one shape; got \(2,\) and \(3,\)"):
        SplitConformal().fit([1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="actual_s must be finite and ≥ 0 seconds; got -1.0 at index 0"):
        SplitConformal().fit([1.0, 2.0], [-1.0, 2.0])
    with pytest.raises(RuntimeError, match="before fit"):
        SplitConformal().upper_bounds([1.0])
    with pytest.raises(ValueError, match="coverage needs at least one request"):
        SplitConformal.coverage([], [])
