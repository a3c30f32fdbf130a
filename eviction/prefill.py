"""Per-depth cost tables of one KV block: prefill seconds saved (from the router's own predictor) and FLOPs.

The prefill seconds a cached block saves come from the SAME prefill
predictor the router uses (:meth:`TermModelSet.predict` on rows built by
:func:`kvcost.features.build.feature_columns`), evaluated once per depth on an
idle worker and read from a table afterwards (a precomputation,
as vidur reads its predictions from a table): a block at depth d (d blocks before it) saves the prefill of its
``block_size_tokens`` tokens with ``d × block_size_tokens`` tokens of context.
It is measured as the difference between two predictions for a request of
``(d + 1) × block_size + 1`` tokens (one token past the block is always
computed, vLLM recomputes the last prompt token): prefill with ``d`` blocks
reused minus prefill with ``d + 1`` reused. The difference cancels the fixed
per-step costs a hit does not save. The table depends only on the depth and
the GPU type (and the cost model).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvcost.core.hardware import FLOPS_PER_MAC, StepTimeModel
from kvcost.core.types import DirectoryMatch, Namespace, RouteRequest, WorkerSnapshot
from kvcost.features.build import feature_columns, stack_features
from kvcost.features.nominal import NominalCosts

#: Depths tabulated by default: 256 blocks of 512 tokens = 131,072 tokens (longest Mooncake prompts ≈ 126k).
DEFAULT_MAX_DEPTH_BLOCKS = 256


@dataclass(frozen=True)
class BlockCostTable:
    """Cost of one block by depth.

    Attributes:
        prefill_saved_s: float64 ``(max_depth + 1,)``, seconds saved by a hit at depth d (≥ 0).
        flops_saved: float64 ``(max_depth + 1,)``, FLOPs a hit at depth d saves.
        size_bytes: bytes of one block (block_size_tokens × kv_bytes_per_token), > 0.
        restore_s: seconds to restore a demoted block; inf = no lower tier (drop only).

    Depths past the table use its last entry.
    """

    prefill_saved_s: np.ndarray
    flops_saved: np.ndarray
    size_bytes: float
    restore_s: float = float("inf")

    def lookup(self, depth_blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(prefill_saved_s, flops_saved)`` at ``depth_blocks`` (int array), clipped to the table."""
        d = np.minimum(np.asarray(depth_blocks, dtype=np.int64), len(self.prefill_saved_s) - 1)
        return self.prefill_saved_s[d], self.flops_saved[d]


def idle_snapshot(gpu: str) -> WorkerSnapshot:
    """A worker of type ``gpu`` with nothing queued or running."""
    return WorkerSnapshot(
        worker_id=0,
        gpu=gpu,
        waiting_prefill=(),
        running_requests=0,
        decode_context_tokens=0,
        kv_usage=0.0,
        idle_cached_blocks=0,
        recent_step_s=0.0,
        step_remaining_s=0.0,
    )


def prefill_saved_table(
    cost_model,
    step_model: StepTimeModel,
    block_size_tokens: int,
    max_depth_blocks: int = DEFAULT_MAX_DEPTH_BLOCKS,
    costs: NominalCosts | None = None,
) -> np.ndarray:
    """Prefill seconds a hit on a block at depth 0 … ``max_depth_blocks`` saves, float64, clipped at 0.

    Args:
        cost_model: the router's cost model (:class:`~kvcost.models.term_set.TermModelSet`); its
            ``predict(features).prefill_s`` is used, in one call for every depth.
        step_model: the GPU type's nominal step-time model (the feature rows need it).
        block_size_tokens: tokens per block, ≥ 1.
        max_depth_blocks: deepest tabulated depth, ≥ 0.
        costs: nominal lookup / first-token costs (default :class:`NominalCosts`).

    Raises:
        ValueError: ``block_size_tokens`` < 1 or ``max_depth_blocks`` < 0.
    """
    if block_size_tokens < 1:
        raise ValueError(f"block_size_tokens = {block_size_tokens}, expected an integer ≥ 1")
    if max_depth_blocks < 0:
        raise ValueError(f"max_depth_blocks = {max_depth_blocks}, expected an integer ≥ 0")
    costs = costs if costs is not None else NominalCosts()
    gpu = step_model.gpu.name
    namespace = Namespace(step_model.model.name, block_size_tokens=block_size_tokens)
    snapshot = idle_snapshot(gpu)
    rows = []
    for depth in range(max_depth_blocks + 1):
        input_tokens = (depth + 1) * block_size_tokens + 1
        request = RouteRequest(depth, 0.0, input_tokens, tuple(range(depth + 1)), namespace)
        matches = [DirectoryMatch(0, depth, "gpu" if depth else "none", 0.0), DirectoryMatch(0, depth + 1, "gpu", 0.0)]
        reusable = [depth * block_size_tokens, (depth + 1) * block_size_tokens]
        rows.append(
            stack_features(feature_columns(request, [snapshot, snapshot], matches, reusable, {gpu: step_model}, costs))
        )
    prefill_s = np.asarray(cost_model.predict(np.vstack(rows)).prefill_s, dtype=np.float64)
    return np.maximum(0.0, prefill_s[0::2] - prefill_s[1::2])


def flops_saved_table(step_model: StepTimeModel, block_size_tokens: int, max_depth_blocks: int) -> np.ndarray:
    """FLOPs a hit on a block at depth d saves, float64 ``(max_depth_blocks + 1,)``.

    2 × num_params × block_size (one multiply-accumulate per weight per token,
    the usual dense-transformer estimate) + the block's causal attention FLOPs
    after ``d × block_size`` context tokens (:meth:`StepTimeModel.prefill_attention_flops`).
    """
    depth = np.arange(max_depth_blocks + 1)
    linear = FLOPS_PER_MAC * step_model.model.num_params * block_size_tokens
    attention = np.array(
        [step_model.prefill_attention_flops(block_size_tokens, int(d) * block_size_tokens) for d in depth]
    )
    return linear + attention


def block_cost_table(
    cost_model,
    step_model: StepTimeModel,
    block_size_tokens: int,
    max_depth_blocks: int = DEFAULT_MAX_DEPTH_BLOCKS,
    restore_s: float = float("inf"),
) -> BlockCostTable:
    """Both tables and the block's bytes for one GPU type (see the module docstring)."""
    return BlockCostTable(
        prefill_saved_s=prefill_saved_table(cost_model, step_model, block_size_tokens, max_depth_blocks),
        flops_saved=flops_saved_table(step_model, block_size_tokens, max_depth_blocks),
        size_bytes=float(block_size_tokens * step_model.model.kv_bytes_per_token),
        restore_s=restore_s,
    )
