"""Benchmark: the full conversation trace, every experiment configuration, 4 workers (``make bench``).

Targets on the 2-core machine (issue #2): all replays under 60 s wall
time together, peak memory under 2 GiB. Run in a child process so that peak
RSS is the replay's own.
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
from kvcost.replay.experiment import run_experiment
from kvcost.replay.settings import DEFAULT_RATE_SCALE
t0 = time.perf_counter()
trace = load_trace("mooncake-conversation", rate_scale=DEFAULT_RATE_SCALE)
summary, _ = run_experiment(trace, ClusterConfig())
print(json.dumps({"requests": len(trace), "wall_s": time.perf_counter() - t0,
                  "p99": {k: v["ttft_p99_s"] for k, v in summary["configs"].items()}}))
"""


@pytest.mark.bench
def test_full_trace_every_configuration():
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _SCRIPT], check=True, capture_output=True, text=True).stdout
    wall_s = time.perf_counter() - t0
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    figures = json.loads(out.strip().splitlines()[-1])
    n_configs = len(figures["p99"])
    simulated = n_configs * figures["requests"]
    print(
        f"\nbench: {figures['requests']} requests × {n_configs} configurations in {figures['wall_s']:.1f} s "
        f"({simulated / figures['wall_s']:.0f} simulated requests/s; process {wall_s:.1f} s incl. imports), "
        f"peak RSS {peak_mib:.0f} MiB; TTFT P99 {figures['p99']}"
    )
    assert wall_s < 60.0
    assert peak_mib < 2048
