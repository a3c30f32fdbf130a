"""The workers' own KV eviction in a replay: what each registered policy needs besides its name.

``kvcost replay``, ``experiment`` and ``bench`` take ``--eviction-policy`` (``ClusterConfig.eviction_policy``,
``lru`` by default: vLLM's and SGLang's order). Every worker's pool then evicts by that policy, so a
routing policy can be compared under the engine cache it will meet, and an eviction policy under the
routing that shapes its workload. Most policies need only their name. Two need more:

* ``cost_aware`` ranks by P(reuse within H), a cure model (:mod:`kvcost.models.reuse_cure`). A replay
  has no training part to fit it on beforehand, so it starts from the recency prior and refits on the
  pools' own block history every :data:`~kvcost.replay.settings.DEFAULT_REFIT_EVERY_S` seconds of
  replay time (:class:`~kvcost.replay.reuse_refit.ReuseRefit`), as a deployment refits from the
  ``block_events`` its engines' KV events fill. H is :class:`~kvcost.eviction.base.EvictionContext`'s
  default, 300 s: with no training log there is no characteristic time to measure it from. It lies
  between the characteristic times the eviction study measured on the conversation trace (195 s at a
  5 % cache, 478 s at 10 %), and H matters there at the per-cent level only (H = ∞ saved 1.4 and
  4.3 % fewer prefill seconds on the validation windows; docs/eviction-study.md).
* ``clairvoyant`` reads the future of the trace being replayed (:func:`next_use_table`): an offline
  reference, which a replay can give it and a deployment cannot.

``kvcost eviction-study`` builds the same contexts with a P(reuse) fitted on a training part instead.
"""

from __future__ import annotations

from kvcost.data.traces import Trace
from kvcost.eviction import EVICTION_POLICIES, EvictionContext, NextUseTable
from kvcost.replay.reuse_refit import ReuseRefit
from kvcost.replay.settings import DEFAULT_REFIT_EVERY_S


def next_use_table(trace: Trace) -> NextUseTable:
    """Every request's full prompt blocks and arrival (the blocks a later request can hit), for ``clairvoyant``."""
    size = trace.block_size_tokens
    requests = trace.requests
    return NextUseTable([r.arrival_s for r in requests], [r.block_hashes[: r.input_tokens // size] for r in requests])


def engine_eviction(
    trace: Trace, policy: str, refit_every_s: float = DEFAULT_REFIT_EVERY_S
) -> tuple[EvictionContext | None, ReuseRefit | None]:
    """The eviction context and the P(reuse) refit schedule of one replay of ``trace`` under ``policy``.

    Args:
        trace: the trace the replay runs (``clairvoyant`` reads its future).
        policy: a registered eviction policy (``kvcost.eviction.EVICTION_POLICIES``).
        refit_every_s: replay seconds between refits of ``cost_aware``'s P(reuse), > 0.

    Returns:
        ``(context, refit)``: ``(None, None)`` for a policy that needs nothing beyond its name (the
        pools' defaults); a context with the trace's future for one that reads it; the default
        context and a fresh :class:`ReuseRefit` (first refit at ``refit_every_s``) for one that uses a
        reuse model. A refit schedule holds one replay's state: call this once per replay.

    Raises:
        KeyError: unknown policy (the message lists the registered ones).
        ValueError: ``refit_every_s`` not a finite number > 0.
    """
    kind = EVICTION_POLICIES.get(policy)
    if kind.reads_future:
        return EvictionContext(next_use=next_use_table(trace)), None
    if kind.uses_reuse_model:
        context = EvictionContext()
        return context, ReuseRefit(refit_every_s, context.horizon_s)
    return None, None
