"""Which workers can serve a request, and whose KV a worker can reuse (docs/architecture.md §2).

A worker can serve a request only if it runs the same model, revision and
adapter with the same block size (the request's
:class:`~kvcost.routing.directory.Namespace` minus KV layout and cache salt). Its KV layout
(``"<dtype>-tp<N>"``: element type and tensor-parallel split) decides whether
KV computed elsewhere is usable there:

* same layout: the blocks move as they are;
* same dtype, other tensor-parallel split: the heads must be re-sharded, which is
  allowed and costs :data:`LAYOUT_CONVERSION_FACTOR` × the network transfer time
  (an assumption: one more pass over the same bytes to gather and scatter heads);
* another dtype: not reusable (a conversion would change the numerics, so the
  cached prefix would not be the exact state the worker would compute).
"""

from __future__ import annotations

import re

from kvcost.core.types import Namespace

#: Extra transfer time of a tensor-parallel re-sharding, × the transfer's own time (assumption).
LAYOUT_CONVERSION_FACTOR = 1.0

_LAYOUT = re.compile(r"(?P<dtype>[a-z0-9]+)-tp(?P<tp>[1-9][0-9]*)")
#: The form of a KV layout as a JSON Schema pattern (what :func:`parse_layout` accepts, whole).
LAYOUT_PATTERN = r"^[a-z0-9]+-tp[1-9][0-9]*$"


def parse_layout(layout: str) -> tuple[str, int]:
    """``"bf16-tp2"`` → ``("bf16", 2)``.

    Raises:
        ValueError: not of the form ``<dtype>-tp<N>`` with N ≥ 1.
    """
    match = _LAYOUT.fullmatch(layout)
    if match is None:
        raise ValueError(f"kv_layout = {layout!r}, expected '<dtype>-tp<N>' such as 'bf16-tp1'")
    return match["dtype"], int(match["tp"])


def serves(worker: Namespace | None, request: Namespace) -> bool:
    """Whether a worker of namespace ``worker`` can serve ``request`` (None: a worker that did not say).

    Model, revision, adapter and block size must match; the KV layout need not (it
    decides only whose KV is reusable there), nor the cache salt (a property of the
    request's tenant, not of the worker).
    """
    if worker is None:
        return True
    return (worker.model, worker.revision, worker.adapter, worker.block_size_tokens) == (
        request.model,
        request.revision,
        request.adapter,
        request.block_size_tokens,
    )


def conversion_factor(source_layout: str, target_layout: str) -> float | None:
    """Extra transfer time (× the transfer time) to use KV of ``source_layout`` on ``target_layout``.

    Returns:
        0.0 for the same layout, :data:`LAYOUT_CONVERSION_FACTOR` for another
        tensor-parallel split of the same dtype, None when not reusable.

    Raises:
        ValueError: a malformed layout.
    """
    source, target = parse_layout(source_layout), parse_layout(target_layout)
    if source == target:
        return 0.0
    if source[0] == target[0]:
        return LAYOUT_CONVERSION_FACTOR
    return None
