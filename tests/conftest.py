"""Shared fixtures: a tiny step-time model with round numbers and a worker snapshot factory.

OpenMP threads sleep rather than spin while they wait (``OMP_WAIT_POLICY=PASSIVE``, set before
scikit-learn or LightGBM loads its OpenMP runtime; a value already set wins). Results are the same:
only idle waiting changes. The tests fit tiny data, where a thread mostly waits for the other at the
next barrier, and spinning through those waits cost more CPU than the fits on the loaded 2-core
machine: one 300-iteration scikit-learn fit on 64 rows took 6.2 s of CPU spinning, 0.15 s passive;
a 150-round LightGBM fit 0.1–6.4 s, 0.03 s passive. Benchmarks (``-m bench``) keep the libraries'
default policy, so that their figures stay those a user gets.
"""

import os

import pytest

from kvcost.core.hardware import GpuSpec, StepTimeModel
from kvcost.core.profiles import OperatorProfile
from kvcost.core.types import WorkerSnapshot
from tests.helpers import UNIT_MODEL

# One layer, one head of dim 1: 4 attention FLOPs per (new, context) token pair and
# 2 × 1 × 1 × 1 × 2 = 4 KV bytes per token.
LINEAR_MODEL = UNIT_MODEL
# 4e12 FLOP/s → 1e-12 s per token pair; 4e6 B/s → 1e-6 s per decode context token.
LINEAR_GPU = GpuSpec(
    name="linear-gpu", memory_bytes=2**30, peak_dense_bf16_flops=4e12, hbm_bytes_per_s=4e6, profile_of="a100"
)
# Non-attention time is exactly 1 µs per batch token (linear through both points).
LINEAR_PROFILE = OperatorProfile(
    num_tokens=[1, 8192], per_layer_s=[1e-6, 8192e-6], once_s=[0.0, 0.0], source="hand-made linear"
)


def pytest_configure(config: pytest.Config) -> None:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` unless benchmarks are selected (runs before any test module imports
    scikit-learn or LightGBM, whose OpenMP runtime reads it once when it loads)."""
    selects_bench = "bench" in config.option.markexpr and "not bench" not in config.option.markexpr
    if not selects_bench:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="session")
def linear_step_model() -> StepTimeModel:
    """Step = 1 µs × tokens + 1e-12 s × prefill pairs + 1e-6 s × decode context + 1 ms; budget 8192."""
    return StepTimeModel(
        LINEAR_MODEL,
        LINEAR_GPU,
        LINEAR_PROFILE,
        token_budget=8192,
        attention_flops_efficiency=1.0,
        decode_bandwidth_efficiency=1.0,
        step_overhead_s=1e-3,
    )


@pytest.fixture
def make_snapshot():
    """Factory for an idle ``WorkerSnapshot`` on GPU type ``"linear-gpu"``; override any field."""

    def make(worker_id: int, **fields) -> WorkerSnapshot:
        defaults = dict(
            gpu="linear-gpu",
            waiting_prefill=(),
            running_requests=0,
            decode_context_tokens=0,
            kv_usage=0.0,
            idle_cached_blocks=0,
            recent_step_s=0.0,
            step_remaining_s=0.0,
        )
        return WorkerSnapshot(worker_id=worker_id, **(defaults | fields))

    return make
