"""Hand-made hardware for exact tests: a model whose every dimension is 1, a 1 ms-per-token profile,
and a measured engine (its step, its points and its profile)."""

import numpy as np

from kvcost.core.engine_profile import EngineProfile, StepFit, attention_pairs
from kvcost.core.hardware import ModelSpec
from kvcost.core.profiles import OperatorProfile

#: 1 layer × 1 head × head_dim 1: 4 attention FLOPs per (new, context) token pair, 4 KV bytes per token.
UNIT_MODEL = ModelSpec(
    name="unit",
    num_layers=1,
    num_q_heads=1,
    num_kv_heads=1,
    head_dim=1,
    hidden_size=1,
    num_params=1,
    dtype_bytes=2,
    profile_dir="none",
)
#: Non-attention time 1 ms per batch token, linear through both points, budget 100 tokens.
MS_PER_TOKEN_PROFILE = OperatorProfile(
    num_tokens=[1, 100], per_layer_s=[1e-3, 0.1], once_s=[0.0, 0.0], source="hand-made 1 ms per token"
)

#: The step a hand-made measured engine runs (kvcost.core.engine_profile.StepFit).
MEASURED_STEP = StepFit(
    overhead_s=2e-3,
    s_per_token=4e-6,
    weight_floor_s=1e-3,
    s_per_attention_pair=2e-9,
    s_per_context_token=5e-8,
    first_token_s=1e-3,
)
PREFILL_TOKENS = np.array([16.0, 64, 128, 256, 512, 1024, 1536])
BATCHES = np.array([1.0, 2, 4, 8, 16, 32])
CONTEXT = 56.0


def measured_points(fit: StepFit = MEASURED_STEP) -> tuple[np.ndarray, np.ndarray]:
    """Prefill points ``(L, s)`` (step + first-token work) and decode points ``(B, K, s)`` that ``fit``
    produces exactly."""
    prefill_s = fit.step_s(PREFILL_TOKENS, attention_pairs(PREFILL_TOKENS), 0.0) + fit.first_token_s
    prefill = np.column_stack([PREFILL_TOKENS, prefill_s])
    decode = np.column_stack([BATCHES, np.full(len(BATCHES), CONTEXT), fit.step_s(BATCHES, 0.0, BATCHES * CONTEXT)])
    return prefill, decode


def measured_profile() -> EngineProfile:
    """An engine profile named ``cpu-tiny`` whose points and fit are :data:`MEASURED_STEP`'s."""
    prefill, decode = measured_points()
    return EngineProfile(
        name="cpu-tiny",
        model="llama-3-8b",
        engine_url="http://engine",
        rtt_s=1e-4,
        prefill=[[*p, False] for p in prefill.tolist()],
        decode=[[*d, False] for d in decode.tolist()],
        fit=MEASURED_STEP,
        token_budget=2048,
        kv_capacity_blocks=100,
        block_size_tokens=16,
    )
