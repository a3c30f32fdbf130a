"""Feature rows of idle cached blocks for the reuse classifier (:data:`EVICTION_FEATURE_SPEC`).

One builder serves training (rows rebuilt from the block access history) and
scoring (rows of a :class:`~kvcost.eviction.base.NodeTable` at
``now_s``), so both see the same columns in the same order.
"""

from __future__ import annotations

import numpy as np

from kvcost.features.spec import EVICTION_FEATURE_NAMES


def eviction_feature_matrix(
    depth_blocks: np.ndarray,
    hits: np.ndarray,
    idle_s: np.ndarray,
    age_s: np.ndarray,
    size_bytes: np.ndarray,
    category: np.ndarray,
    request_blocks: np.ndarray,
    request_reused_blocks: np.ndarray | int = 0,
) -> np.ndarray:
    """float64 ``(n, len(EVICTION_FEATURE_SPEC))`` from per-block columns of shape ``(n,)``.

    ``tail_distance_blocks`` = max(0, request_blocks − 1 − depth_blocks);
    ``mean_reuse_gap_s`` = (age_s − idle_s) / hits (time between storing and the
    last access, per hit), −1 for blocks never hit; ``request_reused_share`` =
    request_reused_blocks / max(request_blocks, 1), clipped to [0, 1]. ``idle_s``
    and ``age_s`` are clipped at 0.
    """
    depth = np.asarray(depth_blocks, dtype=np.float64)
    hits = np.asarray(hits, dtype=np.float64)
    idle = np.maximum(0.0, np.asarray(idle_s, dtype=np.float64))
    age = np.maximum(idle, np.asarray(age_s, dtype=np.float64))
    request = np.asarray(request_blocks, dtype=np.float64)
    gap = np.where(hits > 0, (age - idle) / np.maximum(hits, 1.0), -1.0)
    reused = np.broadcast_to(np.asarray(request_reused_blocks, dtype=np.float64), depth.shape)
    share = np.clip(reused / np.maximum(request, 1.0), 0.0, 1.0)
    tail = np.maximum(0.0, request - 1 - depth)
    columns = (depth, hits, idle, age, size_bytes, category, request, tail, gap, reused, share)
    out = np.column_stack([np.broadcast_to(np.asarray(c, dtype=np.float64), depth.shape) for c in columns])
    return out.reshape(len(depth), len(EVICTION_FEATURE_NAMES))


def eviction_features(nodes, now_s: float) -> np.ndarray:
    """Rows for the idle blocks of a :class:`~kvcost.eviction.base.NodeTable` at ``now_s``."""
    return eviction_feature_matrix(
        nodes.depth_blocks,
        nodes.hits,
        now_s - nodes.last_access_s,
        now_s - nodes.created_s,
        nodes.size_bytes,
        nodes.category,
        nodes.request_blocks,
        nodes.request_reused_blocks,
    )
