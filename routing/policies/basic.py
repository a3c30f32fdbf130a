"""kvcost's own policies: ``round_robin``, ``least_loaded``, ``cost_aware`` and ``learned_cost_aware``."""

from __future__ import annotations

import numpy as np

from kvcost.routing.policies.base import DEFAULT_SEED, ROUTER_POLICIES, PolicyContext, RouterPolicy, argmin_stable


@ROUTER_POLICIES.register("round_robin")
class RoundRobinPolicy(RouterPolicy):
    """Cycle through candidates in order, ignoring load and cache."""

    name = "round_robin"

    def __init__(self, *, seed: int = DEFAULT_SEED) -> None:
        super().__init__(seed=seed)
        self._next = 0

    def choose(self, ctx: PolicyContext) -> tuple[int, str]:
        """Next candidate in turn."""
        index = self._next % len(ctx.snapshots)
        self._next += 1
        return index, "round robin"


@ROUTER_POLICIES.register("least_loaded")
class LeastLoadedPolicy(RouterPolicy):
    """Least outstanding work in tokens: queued prefill tokens + decode work (not request count)."""

    name = "least_loaded"

    def choose(self, ctx: PolicyContext) -> tuple[int, str]:
        """Candidate with the fewest outstanding tokens; lowest worker index on ties."""
        index = argmin_stable(ctx.load_tokens)
        return index, f"least outstanding work {ctx.load_tokens[index]:.0f} tokens"


@ROUTER_POLICIES.register("cost_aware")
class CostAwarePolicy(RouterPolicy):
    """Lowest predicted TTFT on the critical path, among workers within the hot-spot skew limit.

    Weighs cache reuse (shorter prefill) against load (longer queue) through the
    predicted terms, as in docs/architecture.md §1's hot/cold example.
    """

    name = "cost_aware"
    counts_in_flight = True

    def score_s(self, ctx: PolicyContext) -> np.ndarray:
        """The TTFT each candidate is ranked by, seconds ``(n,)``: the composed predicted terms."""
        return ctx.predictions.ttft_s

    def choose(self, ctx: PolicyContext) -> tuple[int, str]:
        """Candidate with the smallest predicted TTFT; ties to the less loaded, then lower index."""
        ttft_s = self.score_s(ctx)
        masked = np.where(ctx.allowed, ttft_s, np.inf)
        best = masked.min()
        ties = np.flatnonzero(masked == best)
        index = int(ties[np.argmin(ctx.load_tokens[ties])])
        reason = f"min predicted TTFT {ttft_s[index] * 1e3:.1f} ms, reuse {ctx.reusable_tokens[index]} tokens"
        most_reuse = int(np.argmax(ctx.reusable_tokens))
        if most_reuse != index and ctx.reusable_tokens[most_reuse] > ctx.reusable_tokens[index]:
            why = "skew limit" if not ctx.allowed[most_reuse] else f"{ttft_s[most_reuse] * 1e3:.1f} ms"
            reason += f"; best-hit worker {ctx.snapshots[most_reuse].worker_id} not chosen ({why})"
        return index, reason


@ROUTER_POLICIES.register("learned_cost_aware")
class LearnedCostAwarePolicy(CostAwarePolicy):
    """``cost_aware`` on the learned models: the router predicts the terms with the learned
    :class:`~kvcost.models.term_set.TermModelSet` and this policy ranks by their composed TTFT.

    It ranks by the composed terms, not by the calibrated P50: the isotonic recalibration is
    monotone, so it cannot improve the order, and its steps map different TTFTs to one value;
    the ties then fell to the load tie-break and lost cache affinity (kvcost issue 13:
    ``gen:agent`` on 4 workers at 80 %, P99 18.1 s ranked by the calibrated P50, 0.56 s by the
    composed terms, 0.60 s for ``cost_aware``). The calibrated P50 / P90 are what it reports.
    Without a learned model (no champion, or it could not be loaded) the router has fallen
    back to the analytic model and this policy routes exactly like ``cost_aware``.
    """

    name = "learned_cost_aware"
    learned = True
