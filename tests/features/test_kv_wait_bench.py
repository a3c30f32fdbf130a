"""Benchmark: the KV-wait estimate (``features.nominal.kv_wait_s``) against the replay's truth (``make bench``).

The truth is each request's ``kv_wait_s``: the time it led its worker's queue, with prefill
budget left, while KV memory kept it out (:mod:`kvcost.replay.worker`). The estimate is the
``kv_wait_estimate_s`` feature of the candidate the router chose. Two cells where memory binds:
the bundled conversation trace on 4 workers at its 95 % load (rate scale 0.595) and the
generated mix on 4 workers at rate scale 1 (about 95 %).
"""

import numpy as np
import pytest

from kvcost.replay.bench import RouterSettings, _trace
from kvcost.replay.config import ClusterConfig
from kvcost.replay.experiment import replay

CELLS = (("mooncake-conversation", 4, 0.595), ("gen:mix", 4, 1.0))


@pytest.mark.bench
@pytest.mark.parametrize(("trace", "workers", "rate_scale"), CELLS)
def test_kv_wait_estimate_against_the_replay(trace, workers, rate_scale):
    config = ClusterConfig(fleet=("a100",) * workers, seed=0, router=RouterSettings(policy="cost_aware"))
    result = replay(_trace(trace, rate_scale, None, 0), config)
    requests = result.requests.set_index("request_id")
    chosen = result.candidates[result.candidates["chosen"]].set_index("request_id").reindex(requests.index)
    truth = requests["kv_wait_s"].to_numpy()
    estimate = chosen["kv_wait_estimate_s"].to_numpy()
    queue_s = requests["actual_queue_s"].sum()
    corr = np.corrcoef(estimate, truth)[0, 1] if truth.std() and estimate.std() else float("nan")
    print(
        f"\nKV wait, {trace} on {workers} workers × {rate_scale}: {len(truth)} requests, "
        f"{result.preemptions} preemptions, {truth.sum() / queue_s:.1%} of queue time; "
        f"truth mean {truth.mean():.3f} s (> 0 for {np.mean(truth > 0):.1%}, P99 {np.quantile(truth, 0.99):.2f} s), "
        f"estimate mean {estimate.mean():.3f} s (> 0 for {np.mean(estimate > 0):.1%}, "
        f"P99 {np.quantile(estimate, 0.99):.2f} s); MAE {np.mean(np.abs(estimate - truth)):.3f} s, "
        f"correlation {corr:.2f}"
    )
    assert estimate.mean() < 10 * truth.mean()  # the estimate it replaced was 55-320× the truth here
