"""Tests for kvcost.routing.promise_survival (the reuse a request can expect at admission)."""

import math

import numpy as np
import pytest

from kvcost.core.types import Namespace, RouteRequest
from kvcost.features.spec import FEATURE_INDEX, FEATURE_NAMES
from kvcost.routing.promise_survival import (
    expected_reuse_blocks,
    expected_reuse_tokens,
    sibling_done_probability,
    sibling_slack_s,
    stored_survival,
)

NS = Namespace("linear", block_size_tokens=512)


@pytest.mark.parametrize(
    ("deficit", "held", "expected"),
    [(0, 80, 1.0), (-5, 0, 1.0), (20, 80, 0.75), (80, 80, 0.0), (200, 80, 0.0), (1, 0, 0.0)],
)
def test_stored_survival_is_one_minus_the_deficit_over_the_held_blocks(deficit, held, expected):
    assert stored_survival(deficit, held) == expected


def test_sibling_done_probability_is_the_output_laws_cdf_at_the_slack_in_steps():
    # exponential output law (cv² = 1), mean 20 tokens; 2 s at 0.1 s a step = 20 tokens: 1 − e^−1
    assert sibling_done_probability(2.0, 0.1, 20.0, 1.0) == pytest.approx(1 - math.exp(-1), rel=1e-12)
    # gamma of shape 2 (cv² = 0.5), mean 20 (scale 10): P(L ≤ 20) = 1 − 3 e^−2
    assert sibling_done_probability(2.0, 0.1, 20.0, 0.5) == pytest.approx(1 - 3 * math.exp(-2), rel=1e-12)
    assert sibling_done_probability(0.0, 0.1, 20.0, 1.0) == 0.0  # admitted before the sibling's first token
    assert sibling_done_probability(1.0, 0.1, 0.0, 1.0) == 1.0  # outputs of 0 tokens end at once


def test_sibling_done_probability_refuses_a_law_without_spread():
    with pytest.raises(ValueError, match=r"output_tokens_cv2 = 0.0, expected a number > 0"):
        sibling_done_probability(1.0, 0.1, 20.0, 0.0)


def test_sibling_slack_is_the_admission_less_the_siblings_first_token():
    assert sibling_slack_s(10.0, 3.0, 12.0) == 1.0
    assert sibling_slack_s(10.0, 3.0, None) == -math.inf


def test_expected_reuse_blocks_discounts_the_stored_and_the_in_flight_parts_apart():
    # 10 promised, 4 of them in flight; stored 6 survive with 1 − 20/80 = 0.75; the sibling is done with 0.5
    assert expected_reuse_blocks(10, 4, 20, 80, 0.5) == 10 - 0.25 * 6 - 0.5 * 4
    assert expected_reuse_blocks(10, 4, 0, 80, 0.5) == 10.0  # no deficit: the whole promise
    assert expected_reuse_blocks(10, 12, 20, 80, 1.0) == 0.0  # all in flight, the sibling surely done
    assert expected_reuse_blocks(0, 0, 20, 80, 0.0) == 0.0


def features_with(deficit, available):
    rows = np.zeros((len(deficit), len(FEATURE_NAMES)))
    rows[:, FEATURE_INDEX["kv_deficit_blocks"]] = deficit
    rows[:, FEATURE_INDEX["kv_available_blocks"]] = available
    return rows


def test_expected_reuse_tokens_takes_off_the_blocks_expected_lost(make_snapshot, linear_step_model):
    """Worker 0 holds 16 blocks in a deficit of 21 with 80 blocks held: 16 × (1 − 21/80) = 11.8 blocks kept,
    4 lost (rounded) = 2,048 tokens; worker 1 has the same promise without a deficit and keeps it all; worker 2
    has 3 blocks in flight whose sibling's first token is 2 s before this request's admission; worker 3 the
    same, with two in-flight chains holding the block, so both must be done first."""
    request = RouteRequest(0, 10.0, 8704, tuple(range(1, 18)), NS)
    snapshots = [make_snapshot(i, kv_capacity_blocks=100) for i in range(4)]
    law = (400.0, 1.0)
    step_s = linear_step_model.step_s(1, 0.0, 8704)  # decode step with the request in the batch: 0.009705 s
    done = sibling_done_probability(2.0, step_s, *law)
    assert done == pytest.approx(1 - math.exp(-2.0 / step_s / 400.0), rel=1e-12)  # 0.4026
    expected = expected_reuse_tokens(
        request,
        snapshots,
        reusable_tokens=np.array([8192, 8192, 1536, 1536]),
        promised_blocks=[16, 16, 3, 3],
        in_flight_blocks=[0, 0, 3, 3],
        siblings=[(None, 0), (None, 0), (9.0, 1), (9.0, 2)],
        features=features_with([21, 0, 21, 21], [20, 20, 20, 20]),
        queue_s=np.array([0.5, 0.5, 1.0, 1.0]),
        step_models={"linear-gpu": linear_step_model},
        output_law=law,
        now_s=10.0,
    )
    # 3 × 0.4026 = 1.21 → 1 block lost; 3 × 0.4026² = 0.49 → none
    assert expected.tolist() == [8192 - 4 * 512, 8192, 1536 - 512, 1536]
