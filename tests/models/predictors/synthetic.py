"""Synthetic feature rows and a known term relation for the predictor tests (tiny, deterministic)."""

import numpy as np

from kvcost.features.spec import FEATURE_INDEX, FEATURE_NAMES

BLOCK_TOKENS = 512
#: Nominal prefill throughput of the synthetic GPU, tokens per second.
TOKENS_PER_S = 8000.0


def synthetic_features(n: int, seed: int = 0) -> np.ndarray:
    """float64 ``(n, len(FEATURE_NAMES))`` plausible rows; queues heavy-tailed (nominal queue ≈ 0–100 s).

    Columns are consistent with one another (``uncached = input − reusable``, block
    multiples, tier 0 iff no reuse) but do not come from a simulator.
    """
    rng = np.random.default_rng(seed)
    input_tokens = rng.integers(64, 32768, n)
    request_blocks = input_tokens // BLOCK_TOKENS
    reusable_tokens = rng.integers(0, request_blocks + 1) * BLOCK_TOKENS
    waiting = rng.poisson(rng.exponential(10.0, n))
    running = rng.integers(0, 128, n)
    queued_prefill_tokens = waiting * rng.integers(500, 8000, n)
    recent_step_s = rng.uniform(0.01, 0.1, n)
    step_remaining_s = rng.uniform(0.0, 1.0, n) * recent_step_s
    columns = {
        "input_tokens": input_tokens,
        "request_blocks": request_blocks,
        "reusable_tokens": reusable_tokens,
        "uncached_tokens": input_tokens - reusable_tokens,
        "reusable_tier": np.where(reusable_tokens > 0, rng.integers(1, 5, n), 0),
        "directory_age_s": rng.exponential(5.0, n),
        "waiting_requests": waiting,
        "running_requests": running,
        "queued_prefill_tokens": queued_prefill_tokens,
        "decode_context_tokens": running * rng.integers(500, 4000, n),
        "kv_usage": rng.uniform(0.0, 1.0, n),
        "idle_cached_blocks": rng.integers(0, 5000, n),
        "recent_step_s": recent_step_s,
        "step_remaining_s": step_remaining_s,
        "kv_available_blocks": rng.integers(0, 900, n),
        "kv_deficit_blocks": rng.integers(0, 50, n),
        "oldest_waiting_s": rng.uniform(0, 5, n),
        "kv_wait_estimate_s": rng.exponential(1.0, n),
        "recent_step_ratio": rng.uniform(0.9, 1.1, n),
        "nominal_queue_s": step_remaining_s + queued_prefill_tokens / TOKENS_PER_S,
        "nominal_lookup_s": 2e-4 + 1e-5 * request_blocks,
        "nominal_prefill_s": 1e-3 + (input_tokens - reusable_tokens) / TOKENS_PER_S,
        "nominal_first_token_s": np.full(n, 2e-3),
        # no tiers, no transfers in the synthetic rows
        **dict.fromkeys(
            ("load_bytes", "disk_load_bytes", "transfer_bytes", "load_backlog_s", "transfer_backlog_s"), np.zeros(n)
        ),
        "nominal_transfer_s": np.zeros(n),
    }
    assert set(columns) == set(FEATURE_NAMES)
    return np.column_stack([np.asarray(columns[name], dtype=np.float64) for name in FEATURE_NAMES])


def queue_target_s(features: np.ndarray, seed: int = 1) -> np.ndarray:
    """The known relation: 0.8 × nominal_queue_s + 0.002 s × waiting_requests + N(0, 10 ms), clipped ≥ 0."""
    rng = np.random.default_rng(seed)
    truth = 0.8 * features[:, FEATURE_INDEX["nominal_queue_s"]] + 0.002 * features[:, FEATURE_INDEX["waiting_requests"]]
    return np.maximum(truth + rng.normal(0.0, 0.01, features.shape[0]), 0.0)
