"""Benchmark: the full conversation trace, the experiment's four routing and tier configurations, 4 workers
(``make bench``).

Targets on the 2-core machine (issue #2, kept by issue 13): the four replays under 60 s wall time
together, peak memory under 2 GiB. Run in a child process so that peak RSS is the replay's own.
The fifth arm, ``cost_aware_evicting``, only changes how the workers evict; its refits of P(reuse)
(21 on this trace, each on the whole block history) take about 3× a plain arm (70.8 s against 93.8 s
for the four on 2026-12-05), so it is timed on its own line, without a target.
"""

import json
import resource
import subprocess
import sys
import time

import pytest

_SCRIPT = """
import json, time
from kvcost.data.traces import load_trace
from kvcost.replay.config import ClusterConfig
from kvcost.replay.experiment import CONFIGURATIONS, configure, replay, study_summary
from kvcost.replay.settings import DEFAULT_RATE_SCALE
t0 = time.perf_counter()
trace = load_trace("mooncake-conversation", rate_scale=DEFAULT_RATE_SCALE)
base = ClusterConfig()
arms = [arm for arm in CONFIGURATIONS if arm.eviction_policy is None]
results = {arm.name: replay(trace, configure(base, arm)) for arm in arms}
wall_s = time.perf_counter() - t0
evicting = next(arm for arm in CONFIGURATIONS if arm.eviction_policy is not None)
results[evicting.name] = replay(trace, configure(base, evicting))
summary = study_summary(results, base.workers)
print(json.dumps({"requests": len(trace), "wall_s": wall_s, "evicting_s": time.perf_counter() - t0 - wall_s,
                  "p99": {k: v["ttft_p99_s"] for k, v in summary["configs"].items()}}))
"""


@pytest.mark.bench
def test_full_trace_every_configuration():
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _SCRIPT], check=True, capture_output=True, text=True).stdout
    wall_s = time.perf_counter() - t0
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    figures = json.loads(out.strip().splitlines()[-1])
    n_configs = len(figures["p99"]) - 1
    simulated = n_configs * figures["requests"]
    print(
        f"\nbench: {figures['requests']} requests × {n_configs} configurations in {figures['wall_s']:.1f} s "
        f"({simulated / figures['wall_s']:.0f} simulated requests/s), cost_aware_evicting "
        f"{figures['evicting_s']:.1f} s (process {wall_s:.1f} s incl. imports), peak RSS {peak_mib:.0f} MiB; "
        f"TTFT P99 {figures['p99']}"
    )
    assert figures["wall_s"] < 60.0
    assert peak_mib < 2048
