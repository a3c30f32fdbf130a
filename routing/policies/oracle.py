"""The ``oracle`` policy: route to the candidate with the simulator's true TTFT at decision time.

Only the replay can supply the truth: for every candidate the simulator forks
the worker (its exact queue, cache and jitter stream) and runs it forward with
no further arrivals until this request's first token; it hands that truth to
the policy through :meth:`~kvcost.routing.policies.base.RouterPolicy.attach_truth`
before the first decision. The oracle therefore knows the present exactly but
not the future (later arrivals that will queue behind or ahead), so it is an
upper bound on what a *greedy* per-request cost router can achieve, not a
global optimum.
"""

from __future__ import annotations

import numpy as np

from kvcost.routing.policies.base import DEFAULT_SEED, ROUTER_POLICIES, PolicyContext, RouterPolicy, TruthFn


@ROUTER_POLICIES.register("oracle")
class OraclePolicy(RouterPolicy):
    """Lowest true TTFT (lowest index on ties). Raises ``ValueError`` without the replay's truth."""

    name = "oracle"
    replay_only = True

    def __init__(self, *, seed: int = DEFAULT_SEED) -> None:
        super().__init__(seed=seed)
        self._truth_s: TruthFn | None = None

    def attach_truth(self, truth_s: TruthFn) -> None:
        """Keep the replay's truth; every decision calls it once."""
        self._truth_s = truth_s

    def choose(self, ctx: PolicyContext) -> tuple[int, str]:
        """Candidate with the smallest true TTFT, seconds.

        Raises:
            ValueError: no truth attached (outside the replay).
        """
        if self._truth_s is None:
            raise ValueError("policy 'oracle' needs the simulator's true TTFT; it is only available in replay")
        true_s = np.asarray(self._truth_s(ctx), dtype=np.float64)
        index = int(np.argmin(true_s))
        return index, f"true TTFT {true_s[index] * 1e3:.1f} ms (predicted {ctx.predictions.ttft_s[index] * 1e3:.1f} ms)"
