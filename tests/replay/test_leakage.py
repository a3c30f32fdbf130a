"""No leakage: a logged candidate's features equal those rebuilt from the state at decision time.

The replay logs one feature row per candidate. Here the router's inputs (the
request, the workers' snapshots, the directory matches and the prefixes in
flight from earlier routing) are captured at the moment of each decision —
copies of what existed then, nothing from later — and the rows are rebuilt with
``feature_columns``; they must equal the logged rows exactly, so nothing known
only after the decision can have entered.
"""

import copy
from dataclasses import replace

import numpy as np

from kvcost.core.types import reusable_tokens_for
from kvcost.features.build import feature_columns, stack_features
from kvcost.features.spec import FEATURE_NAMES
from kvcost.replay.config import ClusterConfig
from kvcost.replay.simulator import ClusterSimulator

from .test_simulator import busy_trace


def test_logged_features_rebuild_from_decision_time_state():
    trace = busy_trace()
    sim = ClusterSimulator(ClusterConfig(fleet=("a100", "a100"), jitter_sigma=0.0), trace.block_size_tokens)
    captured = {}
    route = sim.router.route

    def capturing_route(request, snapshots, now_s):
        matches = sim.directory.match(request.namespace, request.block_hashes, [s.worker_id for s in snapshots], now_s)
        in_flight = copy.deepcopy(sim.router.in_flight)
        in_flight.expire(now_s)
        flying = [in_flight.match(request.namespace, request.block_hashes, [m.worker_id])[0] for m in matches]
        pairs = zip(matches, flying, strict=True)
        matches = [replace(m, reusable_blocks=b, tier="gpu") if b > m.reusable_blocks else m for m, b in pairs]
        captured[request.request_id] = (request, copy.deepcopy(list(snapshots)), matches)
        return route(request, snapshots, now_s)

    sim.router.route = capturing_route
    result = sim.run(trace)
    logged = result.candidates.sort_values(["request_id", "worker_id"])
    for request_id, (request, snapshots, matches) in captured.items():
        reuse = [
            reusable_tokens_for(m.reusable_blocks, request.namespace.block_size_tokens, request.input_tokens)
            for m in matches
        ]
        rebuilt = stack_features(
            feature_columns(request, snapshots, matches, reuse, sim.step_models, sim.router.settings.costs)
        )
        rows = logged[logged["request_id"] == request_id][list(FEATURE_NAMES)].to_numpy()
        assert np.array_equal(rows, rebuilt), request_id
    assert len(captured) == len(trace.requests) == logged["request_id"].nunique()
    assert logged["reusable_tokens"].sum() > 0  # the busy trace's requests reuse what earlier ones routed
