"""Tests for kvcost.features.finish_times: the k-th finish of a decode batch, by hand where the law
has a closed form."""

import math

import pytest

from kvcost.features.finish_times import finish_steps, finish_steps_batch


def test_finish_steps_for_exponential_lengths_ignores_the_progress():
    # 2 decoders, 1 finish: the expected count reaches 1 × 2 / 2.5 = 0.8 when 2 (1 − e^(−s / 100)) = 0.8
    assert finish_steps(1, [3, 7], 100, 1.0) == pytest.approx(-100 * math.log(0.6), rel=1e-9)
    # both: 2 (1 − e^(−s / 100)) = 1.6; the same whatever the decoders have produced
    both = -100 * math.log(0.2)
    assert finish_steps(2, [0, 500], 100, 1.0) == pytest.approx(both, rel=1e-9)
    assert finish_steps(2, [50, 50], 100, 1.0) == pytest.approx(both, rel=1e-9)


def erlang4_survival(x: float, scale: float) -> float:
    """Survival of the gamma of shape 4 (cv² = 0.25), in closed form: e^(−y) (1 + y + y²/2 + y³/6)."""
    y = x / scale
    return math.exp(-y) * (1 + y + y * y / 2 + y**3 / 6)


@pytest.mark.parametrize("produced", [0, 50, 200])
def test_finish_steps_with_less_spread_than_an_exponential_waits_longer_for_young_decoders(produced):
    # one decoder, mean 100, cv² 0.25 (shape 4, scale 25): the count reaches 1 / 1.5 when
    # S(a + s) ÷ S(a) = 1/3, S checked in closed form (finish_steps reads ln S from a table: ~10⁻⁵)
    steps = finish_steps(1, [produced], 100, 0.25)
    assert erlang4_survival(produced + steps, 25) / erlang4_survival(produced, 25) == pytest.approx(1 / 3, rel=1e-4)
    assert finish_steps(1, [0], 100, 0.25) > finish_steps(1, [50], 100, 0.25) > finish_steps(1, [200], 100, 0.25)


def test_finish_steps_counts_decoders_far_beyond_the_law_as_finishing_now():
    # shape 100, scale 1: a decoder at 10⁷ tokens has survival 0; one finish is already there
    assert finish_steps(1, [10**7, 0], 100, 0.01) == 0.0


@pytest.mark.parametrize(
    ("finishes", "produced", "mean", "cv2", "message"),
    [
        (0, [1, 2], 100, 1.0, "finishes = 0, expected an integer in 1 … 2"),
        (3, [1, 2], 100, 1.0, "finishes = 3, expected an integer in 1 … 2"),
        (1, [1], 0, 1.0, "mean_tokens = 0, cv2 = 1.0: expected numbers > 0"),
        (1, [1], 100, 0.0, "mean_tokens = 100, cv2 = 0.0: expected numbers > 0"),
    ],
)
def test_finish_steps_refuses_bad_input_by_name(finishes, produced, mean, cv2, message):
    with pytest.raises(ValueError, match=message):
        finish_steps(finishes, produced, mean, cv2)


BATCHES = [  # (finishes, tokens produced so far): fewer decoders than groups, more, one far beyond the law
    (1, [3]),
    (2, [0, 500]),
    (5, [7, 0, 30, 12, 250, 90, 4]),
    (20, list(range(0, 400, 11))),
    (1, [10**7, 0]),
    (36, list(range(0, 400, 11))),
]


@pytest.mark.parametrize("cv2", [0.01, 0.25, 1.0, 4.6])
def test_finish_steps_batch_is_each_batch_alone(cv2):
    # the roots are found together; each is the one its batch gets alone (to rounding: numpy sums
    # a (6, 16) array's rows in another order than a (1, 16) one's)
    together = finish_steps_batch([k for k, _ in BATCHES], [p for _, p in BATCHES], 100, cv2)
    assert together.tolist() == pytest.approx([finish_steps(k, p, 100, cv2) for k, p in BATCHES], rel=1e-12)


def test_finish_steps_batch_of_exponential_lengths_by_hand():
    # exponential: mean × ln((n + ½) ÷ (n − k + ½)); 2 of 2 decoders: 100 ln 5; 1 of 1: 100 ln 3
    got = finish_steps_batch([2, 1], [[3, 9], [40]], 100, 1.0)
    assert got == pytest.approx([100 * math.log(5), 100 * math.log(3)], rel=1e-9)
    assert finish_steps_batch([], [], 100, 1.0).shape == (0,)


@pytest.mark.parametrize(
    ("finishes", "produced", "message"),
    [
        ([1, 3], [[1], [1, 2]], r"finishes\[1\] = 3, expected an integer in 1 … 2"),
        ([1], [[1], [1, 2]], "finishes has 1 entries and output_tokens_so_far 2"),
    ],
)
def test_finish_steps_batch_refuses_bad_input_by_name(finishes, produced, message):
    with pytest.raises(ValueError, match=message):
        finish_steps_batch(finishes, produced, 100, 1.0)
