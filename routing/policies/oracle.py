"""The ``oracle`` policy: route to the candidate with the simulator's true TTFT at decision time.

Only the replay can supply the truth: for every candidate the simulator forks
the worker (its exact queue, cache and jitter stream) and runs it forward with
no further arrivals until this request's first token. The oracle therefore
knows the present exactly but not the future (later arrivals that will queue
behind or ahead), so it is an upper bound on what a *greedy* per-request cost
router can achieve, not a global optimum.
"""

from __future__ import annotations

import numpy as np

from kvcost.routing.policies.base import ROUTER_POLICIES, PolicyContext


@ROUTER_POLICIES.register("oracle")
class OraclePolicy:
    """Lowest true TTFT (lowest index on ties). Raises ``ValueError`` outside the replay."""

    name = "oracle"

    def choose(self, ctx: PolicyContext) -> tuple[int, str]:
        """Candidate with the smallest true TTFT, seconds."""
        if ctx.true_ttft_s is None:
            raise ValueError("policy 'oracle' needs the simulator's true TTFT; it is only available in replay")
        true_s = np.asarray(ctx.true_ttft_s(), dtype=np.float64)
        index = int(np.argmin(true_s))
        return index, f"true TTFT {true_s[index] * 1e3:.1f} ms (predicted {ctx.predictions.ttft_s[index] * 1e3:.1f} ms)"
