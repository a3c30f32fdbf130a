"""The policy interface and its registry (names are permanent CLI names).

A policy sees a :class:`PolicyContext` — the candidates, their directory
matches and predicted terms, their loads, which of them the hot-spot skew
limit allows — and returns the index of the chosen candidate and a one-line
reason. A policy may keep state (a round-robin counter, an approximate prefix
tree of routed requests); if it defines ``on_routed(ctx, index)`` the router
calls it after every decision.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from kvcost.core.composition import CalibratedTTFT, TermPredictions
from kvcost.core.hardware import StepTimeModel
from kvcost.core.registry import Registry
from kvcost.core.types import DirectoryMatch, RouteRequest, WorkerSnapshot


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """What a policy may look at for one decision.

    Attributes:
        request: the request.
        snapshots: candidate workers, shape ``(n,)``.
        reusable_tokens: int64 ``(n,)`` directory-reported reusable prefix.
        predictions: predicted terms ``(n,)`` each, seconds.
        load_tokens: float64 ``(n,)`` outstanding prefill tokens + decode work (see ``load_tokens``).
        allowed: bool ``(n,)``: False for workers over the hot-spot skew limit
            (never all False).
        now_s: decision time on the caller's clock, seconds.
        matches: directory match per candidate (event-fed directory).
        step_models: nominal step-time model per GPU type name.
        features: float64 ``(n, len(FEATURE_SPEC))`` feature rows.
        calibrated: calibrated TTFT (P50 score, P90 bound) per candidate when the
            router's cost model is learned; None with the analytic model.
        true_ttft_s: only in replay: returns the simulator's true TTFT per candidate
            at decision time, seconds ``(n,)`` (for the ``oracle`` policy); None in production.
    """

    request: RouteRequest
    snapshots: tuple[WorkerSnapshot, ...]
    reusable_tokens: np.ndarray
    predictions: TermPredictions
    load_tokens: np.ndarray
    allowed: np.ndarray
    now_s: float = 0.0
    matches: tuple[DirectoryMatch, ...] = ()
    step_models: Mapping[str, StepTimeModel] = field(default_factory=dict)
    features: np.ndarray | None = None
    calibrated: CalibratedTTFT | None = None
    true_ttft_s: Callable[[], np.ndarray] | None = None


class RouterPolicy(Protocol):
    """A routing rule: ``choose`` returns ``(candidate index, reason)``."""

    name: str

    def choose(self, ctx: PolicyContext) -> tuple[int, str]: ...


ROUTER_POLICIES: Registry[type] = Registry("router policy")


def argmin_stable(values: np.ndarray, mask: np.ndarray | None = None) -> int:
    """Index of the smallest value (lowest index on ties), among ``mask`` if given."""
    if mask is not None:
        values = np.where(mask, values, np.inf)
    return int(np.argmin(values))


def random_among_ties(values: np.ndarray, rng: np.random.Generator) -> tuple[int, int]:
    """Index of the smallest value, uniformly random among ties (as Dynamo, llm-d and AIBrix pick).

    The generator is drawn from only when there is a tie, so a policy's random
    stream advances exactly as often as its source's would.

    Returns:
        ``(index, number of tied candidates)``.
    """
    ties = np.flatnonzero(values == values.min())
    index = int(ties[0]) if ties.size == 1 else int(rng.choice(ties))
    return index, int(ties.size)


def make_policy(name: str) -> RouterPolicy:
    """A fresh instance of the policy registered as ``name`` (KeyError lists known names)."""
    return ROUTER_POLICIES.get(name)()
