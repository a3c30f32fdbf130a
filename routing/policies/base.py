"""The policy base class and its registry (names are permanent CLI names).

A policy sees a :class:`PolicyContext` — the candidates, their directory
matches and predicted terms, their loads, which of them the hot-spot skew
limit allows — and returns the index of the chosen candidate and a one-line
reason. Every policy subclasses :class:`RouterPolicy`: its class flags say
what the callers must know about it (``replay_only``, ``learned``), and its
hooks (no-ops by default) let it keep state (``on_routed``: a round-robin
counter, an approximate prefix tree of routed requests), take the replay's
truth (``attach_truth``: the oracle) or learn from the outcomes of its own
decisions (``on_outcome``, ``fit_own_model``: ``llmd_predicted_latency``).
:func:`make_policy` builds one by name.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kvcost.core.composition import CalibratedTTFT, TermPredictions
from kvcost.core.hardware import StepTimeModel
from kvcost.core.registry import Registry
from kvcost.core.types import DirectoryMatch, RouteRequest, WorkerSnapshot
from kvcost.features.nominal import DEFAULT_EXPECTED_DECODE_TOKENS


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
        remaining_decode_tokens: expected remaining output of a request found decoding, tokens
            (≥ 0): the router's online estimate from the output lengths observed so far
            (:class:`~kvcost.features.decode_length.OutputLengthEstimate`).
        kv_wait_sd_s: float64 ``(n,)`` standard deviation of each candidate's KV-wait estimate, seconds
            (:func:`~kvcost.features.nominal.kv_wait_sd_batch_s`); None where the caller has none (the
            cost-aware policies then rank by the score alone).
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
    remaining_decode_tokens: float = DEFAULT_EXPECTED_DECODE_TOKENS
    kv_wait_sd_s: np.ndarray | None = None


#: The replay's truth for one decision: ``truth_s(ctx)`` is the TTFT each candidate of ``ctx`` would
#: really get at ``ctx.now_s``, seconds, float64 ``(n,)`` (``inf`` where the request cannot be served).
TruthFn = Callable[[PolicyContext], np.ndarray]

#: Seed of a policy's random tie-breaks when none is given (the baselines break ties at random, as
#: their sources do; a fixed seed keeps replays reproducible).
DEFAULT_SEED = 0


class RouterPolicy:
    """Base class of the routing rules: ``choose`` returns ``(candidate index, reason)``.

    Class flags (read by the callers instead of the policy's name):
        name: registry name.
        replay_only: True = the policy needs what only a replay has (the simulator's truth,
            :meth:`attach_truth`); the scoring service refuses it.
        learned: True = the policy ranks by a model learned from the fleet's own measurements: a
            replay gives it the champion (or online learning), and a router without a learned model
            warns once that it falls back to the analytic one.
        own_model: True (with ``learned``) = the model is the policy's own, fitted by
            :meth:`fit_own_model`, not the router's cost model: online learning in a replay retrains
            the policy on its schedule instead of the router's term models.
        counts_in_flight: True = the policy ranks by kvcost's predicted terms, so the router may
            credit it with in-flight prefixes (``RouterSettings.count_in_flight``); the baselines keep
            their published rules and never see them.

    Args:
        seed: seed of the policy's random tie-breaks (policies that break no tie at random ignore it).
    """

    name = "base"
    replay_only = False
    learned = False
    own_model = False
    counts_in_flight = False

    def __init__(self, *, seed: int = DEFAULT_SEED) -> None:
        self.seed = seed

    def choose(self, ctx: PolicyContext) -> tuple[int, str]:
        """``(index of the chosen candidate in ctx.snapshots, one-line reason)``."""
        raise NotImplementedError

    def on_routed(self, ctx: PolicyContext, index: int) -> None:
        """Called by the router after every decision, with the chosen index (default: nothing)."""

    def attach_truth(self, truth_s: TruthFn) -> None:
        """The replay hands over its truth before the first decision (default: not needed, ignored)."""

    def on_outcome(self, request_id: int, ttft_s: float, now_s: float) -> None:
        """A request routed by this policy got its first token after ``ttft_s`` seconds, reported at
        ``now_s`` (the replay reports it at the end of the step that produced the first token, a live
        gateway when the first token streams back). Default: nothing."""

    def fit_own_model(self, rows: pd.DataFrame) -> None:
        """Refit the policy's own model (``own_model`` policies) on the outcomes so far.

        ``rows``: one row per completed request, completion order, with the chosen candidate's
        decision-time features (``FEATURE_NAMES`` columns) and ``actual_ttft_s``. Default: nothing.
        """


ROUTER_POLICIES: Registry[type[RouterPolicy]] = Registry("router policy")


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


def make_policy(name: str, seed: int = DEFAULT_SEED, **params) -> RouterPolicy:
    """A fresh instance of the policy registered as ``name``.

    Args:
        name: registered name (:data:`ROUTER_POLICIES`).
        seed: seed of its random tie-breaks.
        **params: the policy's own keyword parameters (e.g. ``kv_capacity_blocks`` of ``preble_e2``).

    Raises:
        KeyError: unknown name; the message lists the registered names.
        TypeError: a parameter the policy does not take.
    """
    return ROUTER_POLICIES.get(name)(seed=seed, **params)


def check_policy_params(name: str, params: Sequence[tuple[str, float]]) -> None:
    """Check ``params``, ``(parameter, number)`` pairs, as keyword parameters of the policy registered as ``name``.

    Each parameter must be one the policy's constructor takes (besides ``seed``) and its value one the
    policy accepts (the policy's own checks run: a price weight must be ≥ 0, ...). An unknown ``name``
    is not checked here: :func:`make_policy` raises for it, listing the registered names.

    Raises:
        ValueError: an entry that is not a ``(str, number)`` pair, a parameter the policy does not take
            (the message lists those it takes), or a value the policy refuses.
    """
    for pair in params:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)):
            raise ValueError(f"policy_params entry {pair!r}, expected a (name, value) pair")
        if isinstance(pair[1], bool) or not isinstance(pair[1], int | float):
            raise ValueError(f"policy_params {pair[0]} = {pair[1]!r}, expected a number")
    if name not in ROUTER_POLICIES:
        return
    taken = sorted(set(inspect.signature(ROUTER_POLICIES.get(name)).parameters) - {"seed"})
    for parameter, _ in params:
        if parameter not in taken:
            expected = ", ".join(taken) or "none"
            raise ValueError(f"policy_params name {parameter!r}, expected a parameter of policy {name!r}: {expected}")
    make_policy(name, **dict(params))
