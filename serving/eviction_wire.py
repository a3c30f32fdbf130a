"""``POST /v1/evict/rank``: the wire request → :class:`NodeTable` → ranking → wire response."""

from __future__ import annotations

import math

import numpy as np

from kvcost.eviction.base import EvictionContext, NodeTable, make_eviction_policy, rank_nodes
from kvcost.serving.errors import FieldError
from kvcost.serving.schemas import EvictNodeOut, EvictRankIn, EvictRankResponse


def node_table(body: EvictRankIn) -> NodeTable:
    """The request's nodes as a :class:`NodeTable` (rows in request order).

    Raises:
        FieldError: duplicate ``node_id``, ``created_s`` after ``last_access_s``, ``last_access_s``
            after ``now_s``, ``request_reused_blocks`` above the request's blocks, a ``parent_id``
            not in the list or not shallower than the node (``loc`` names the node and field).
    """
    nodes = body.nodes
    row = {}
    for i, node in enumerate(nodes):
        if node.node_id in row:
            raise FieldError(("nodes", i, "node_id"), f"node_id {node.node_id} appears twice")
        if node.created_s > node.last_access_s:
            raise FieldError(("nodes", i, "created_s"), f"created_s {node.created_s} is after last_access_s")
        if node.last_access_s > body.now_s:
            raise FieldError(
                ("nodes", i, "last_access_s"), f"last_access_s {node.last_access_s} is after now_s {body.now_s}"
            )
        request_blocks = _request_blocks(node)
        if node.request_reused_blocks > request_blocks:
            raise FieldError(
                ("nodes", i, "request_reused_blocks"),
                f"request_reused_blocks {node.request_reused_blocks} exceeds request_blocks {request_blocks}",
            )
        row[node.node_id] = i
    parent = np.full(len(nodes), -1, dtype=np.int64)
    for i, node in enumerate(nodes):
        if node.parent_id is None:
            continue
        j = row.get(node.parent_id)
        if j is None or nodes[j].depth_blocks >= node.depth_blocks:
            raise FieldError(
                ("nodes", i, "parent_id"),
                f"parent_id {node.parent_id} must be a node_id of this list with a smaller depth_blocks",
            )
        parent[i] = j

    def col(name: str, dtype=np.float64) -> np.ndarray:
        return np.array([getattr(n, name) for n in nodes], dtype=dtype)

    prefill_s = col("prefill_saved_s")
    return NodeTable(
        depth_blocks=col("depth_blocks", np.int64),
        hits=col("hits", np.int64),
        last_access_s=col("last_access_s"),
        created_s=col("created_s"),
        size_bytes=col("size_bytes"),
        prefill_saved_s=prefill_s,
        restore_s=np.array([math.inf if n.restore_s is None else n.restore_s for n in nodes]),
        flops_saved=np.array(
            [p if n.flops_saved is None else n.flops_saved for n, p in zip(nodes, prefill_s, strict=True)]
        ),
        category=col("category", np.int64),
        request_blocks=np.array([_request_blocks(n) for n in nodes]),
        parent=parent,
        request_reused_blocks=col("request_reused_blocks", np.int64),
    )


def _request_blocks(node) -> int:
    """The node's ``request_blocks``, or ``depth_blocks + 1`` when the caller sent none."""
    return node.depth_blocks + 1 if node.request_blocks is None else node.request_blocks


def rank_request(body: EvictRankIn, reuse_model=None) -> EvictRankResponse:
    """Rank ``body.nodes`` under ``body.policy`` at ``body.now_s`` (a fresh policy: no learned state).

    ``cost_aware`` uses ``reuse_model`` (the service's ``--reuse-model-dir``, with the H it was fitted
    for) or, without one, its recency prior with ``body.horizon_s``; ``lhd`` its prior counts.
    The response says which P(reuse) and H were used.
    """
    table = node_table(body)
    horizon_s = reuse_model.horizon_s if reuse_model is not None else body.horizon_s
    context = EvictionContext(horizon_s=horizon_s, reuse_model=reuse_model)
    policy = make_eviction_policy(body.policy, context)
    ranking = rank_nodes(policy, table, body.now_s)
    t = ranking.terms

    def finite(x: float) -> float | None:
        return float(x) if math.isfinite(x) else None

    out = [
        EvictNodeOut(
            node_id=body.nodes[i].node_id,
            p_reuse=finite(t["p_reuse"][i]),
            prefill_saved_s=float(t["prefill_saved_s"][i]),
            size_bytes=float(t["size_bytes"][i]),
            restore_s=finite(t["restore_s"][i]),
            value=float(t["value"][i]),
        )
        for i in ranking.order.tolist()
    ]
    if not policy.uses_reuse_model:
        horizon_s, source = None, None
    else:
        source = type(reuse_model).__name__ if reuse_model is not None else "recency_prior"
    return EvictRankResponse(policy=body.policy, now_s=body.now_s, horizon_s=horizon_s, reuse_model=source, nodes=out)
