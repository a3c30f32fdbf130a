"""Scheduled refits of ``cost_aware`` eviction's P(reuse) on the pools' own block history, during a replay.

kvcost issue 17: a P(reuse) fitted once on the first part of a trace and then
fixed cannot follow a workload whose conversations, think times or sharing
change, where GDSF's frequency count and inflation clock adapt by themselves.
This is the eviction side's "scheduled retraining job" (as
:class:`~kvcost.replay.online.OnlineLearner` is the routing terms'): every
``every_s`` seconds of replay time the cure model
(:class:`~kvcost.models.reuse_cure.CureReuseModel`) is fitted again, by maximum
likelihood, on every idle period the pools have logged so far (the ones still
open censored at the refit time), and every pool's ``cost_aware`` policy ranks
with it from its next re-rank on. A deployment does the same from the
``block_events`` table its engines' KV events fill.

Why the whole history rather than a recent window: the cure likelihood already
weighs each idle period by what it shows (a reuse after a gap, or a gap still
open), the long gaps that decide P(reuse) for an old block take hours of log to
observe at all, and the classes (the last request's reused share) carry the
shift between first turns and continuing conversations.

The history is the one the policy itself shaped (blocks it evicted early show
shorter idle periods): the same feedback a deployed policy sees; the idle
periods a block ends by its eviction are censored there, not counted as "never
reused".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import pandas as pd

from kvcost.models.reuse import idle_periods
from kvcost.models.reuse_cure import CureReuseModel


@dataclass
class ReuseRefit:
    """Refit schedule of the cure model during one replay.

    Attributes:
        every_s: replay seconds between refits, > 0.
        horizon_s: H of P(reuse within H), > 0 (kept from the initial fit).
        next_s: replay time of the next refit.
        refits: each refit, ``{"t_s", "idle_periods", "reuses"}``.

    Raises:
        ValueError: ``every_s`` or ``horizon_s`` not a finite number > 0.
    """

    every_s: float
    horizon_s: float
    next_s: float = 0.0
    refits: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("every_s", "horizon_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} = {value!r}, expected a finite number of seconds > 0")
        self.next_s = self.next_s or self.every_s

    def maybe_refit(self, now_s: float, events: Callable[[], pd.DataFrame], policies: Sequence) -> bool:
        """Refit when ``now_s`` reached :attr:`next_s`; returns True when a model was installed.

        Args:
            now_s: replay time, seconds.
            events: the pools' block history so far (``worker_id`` + ``BLOCK_EVENT_COLUMNS``), called
                only when a refit is due.
            policies: the pools' eviction policies; those that use a reuse model get the new one.
        """
        if now_s < self.next_s:
            return False
        self.next_s = now_s + self.every_s
        periods = idle_periods(events())
        reuses = int((periods["next_demand_s"] <= now_s).sum())
        if not reuses:
            return False
        model = CureReuseModel.fit(periods, now_s, self.horizon_s)
        for policy in policies:
            if policy.uses_reuse_model:
                policy.context = replace(policy.context, reuse_model=model)
        self.refits.append({"t_s": now_s, "idle_periods": int(len(periods)), "reuses": reuses})
        return True
