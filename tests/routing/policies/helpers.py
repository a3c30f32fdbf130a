"""Shared builders for the policy tests: a decision context over hand-made snapshots."""

from dataclasses import replace

import numpy as np

from kvcost.core.composition import TermPredictions
from kvcost.core.types import Namespace, RouteRequest
from kvcost.routing.policies import PolicyContext

#: 16-token blocks keep the hand computations small.
NS = Namespace("m", block_size_tokens=16)


def context(step_model, snapshots, hashes, now_s=0.0, input_tokens=None):
    """A decision context for a request of ``hashes`` (16 tokens each unless ``input_tokens``) on GPU "linear-gpu"."""
    n = len(snapshots)
    zeros = np.zeros(n)
    request = RouteRequest(0, now_s, input_tokens or 16 * len(hashes), tuple(hashes), NS)
    return PolicyContext(
        request=request,
        snapshots=tuple(snapshots),
        reusable_tokens=np.zeros(n, dtype=np.int64),
        predictions=TermPredictions(zeros, zeros, zeros, zeros, zeros),
        load_tokens=zeros,
        allowed=np.ones(n, dtype=bool),
        now_s=now_s,
        step_models={"linear-gpu": step_model},
    )


def with_cache_and_ttft(ctx, reusable_tokens, ttft_s=None):
    """``ctx`` with the given reusable tokens per candidate and predicted TTFTs (all in the prefill term)."""
    zeros = np.zeros(len(ctx.snapshots))
    ttft = np.array(ttft_s if ttft_s is not None else zeros, dtype=np.float64)
    return replace(
        ctx,
        reusable_tokens=np.array(reusable_tokens, dtype=np.int64),
        predictions=TermPredictions(zeros, zeros, zeros, ttft, zeros),
    )
