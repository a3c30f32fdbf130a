"""Hand-made hardware for exact tests: a model whose every dimension is 1, and a 1 ms-per-token profile."""

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
