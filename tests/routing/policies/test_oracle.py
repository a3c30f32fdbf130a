import numpy as np
import pytest

from kvcost.core.composition import TermPredictions
from kvcost.core.types import Namespace, RouteRequest
from kvcost.routing.policies import ROUTER_POLICIES, PolicyContext


def _ctx(make_snapshot):
    zeros = np.zeros(3)
    return PolicyContext(
        request=RouteRequest(0, 0.0, 100, (), Namespace("m", block_size_tokens=16)),
        snapshots=tuple(make_snapshot(i) for i in range(3)),
        reusable_tokens=np.zeros(3, dtype=np.int64),
        predictions=TermPredictions(zeros, zeros, zeros, np.array([0.1, 0.2, 0.3]), zeros),
        load_tokens=zeros,
        allowed=np.ones(3, dtype=bool),
    )


def test_oracle_follows_the_truth_not_the_prediction(make_snapshot):
    policy = ROUTER_POLICIES.get("oracle")()
    seen = []
    policy.attach_truth(lambda ctx: seen.append(ctx.now_s) or np.array([0.5, 0.25, np.inf]))
    index, reason = policy.choose(_ctx(make_snapshot))
    assert seen == [0.0]  # the truth is asked once per decision, with the decision's context
    assert index == 1
    assert reason == "true TTFT 250.0 ms (predicted 200.0 ms)"


def test_oracle_outside_replay_is_an_error(make_snapshot):
    with pytest.raises(ValueError, match="only available in replay"):
        ROUTER_POLICIES.get("oracle")().choose(_ctx(make_snapshot))
