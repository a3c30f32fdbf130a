"""Promotion by replay: a challenger becomes champion only if it routes the latest window no worse.

kvcost issue 13 §4. A lower holdout MAE does not make a better router: the
errors that matter are those that flip a decision, and a model trained on its
own routing sees a biased sample. So ``kvcost models promote --trace T``
replays the latest window of ``T`` twice with ``learned_cost_aware``, once with
the challenger's term models and once with the champion's (the analytic model
when no champion can be loaded, which is what routes meanwhile), and passes
the challenger only if both its TTFT P50 and P99 are no worse. Replays are
seeded, so the comparison is exact: same trace, same arrivals, same jitter.

Where a log cannot be replayed (a live log without block hashes or an engine
profile), the promotion is gated on holdout MAE and coverage alone and says so
(:func:`kvcost.models.mlflow_store.promote`).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcost.data.traces import Trace, load_trace
from kvcost.models.mlflow_store import RoutingGate, RoutingVerdict
from kvcost.models.term_set import TermModelSet
from kvcost.replay.config import ClusterConfig
from kvcost.replay.experiment import replay
from kvcost.replay.online import DEFAULT_WINDOW_S, route_figures, routes_no_worse
from kvcost.routing.router import RouterSettings

#: The policy both models route with in the gate's replays.
GATE_POLICY = "learned_cost_aware"


@dataclass(frozen=True, slots=True)
class ReplayWindow:
    """The replay a promotion is judged on.

    Attributes:
        trace: trace name or path (anything ``--trace`` accepts).
        window_s: the latest this many seconds of trace time are replayed (> 0).
        workers: A100 workers serving Llama-3-8B (≥ 1).
        rate_scale: arrival times are divided by this (> 0).
        seed: seed of the replay's random streams.
    """

    trace: str
    window_s: float = DEFAULT_WINDOW_S
    workers: int = 4
    rate_scale: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.window_s > 0:
            raise ValueError(f"window_s = {self.window_s}, expected seconds > 0")
        if self.workers < 1:
            raise ValueError(f"workers = {self.workers}, expected an integer ≥ 1")
        if not self.rate_scale > 0:
            raise ValueError(f"rate_scale = {self.rate_scale}, expected a number > 0")

    def load(self) -> tuple[Trace, float]:
        """The latest window of the trace, and where it starts (seconds of trace time).

        Raises:
            KeyError / ValueError / OSError: as :func:`~kvcost.data.traces.load_trace` (unknown or bad trace).
        """
        end_s = max(r.arrival_s for r in load_trace(self.trace, spread_seed=None).requests)
        start_s = max(0.0, end_s - self.window_s)
        window = load_trace(self.trace, start_s=start_s, rate_scale=self.rate_scale, spread_seed=self.seed)
        return window, start_s


def replay_figures(trace: Trace, config: ClusterConfig, model: TermModelSet | None) -> dict[str, float]:
    """TTFT P50 and P99 (seconds) of ``trace`` routed by :data:`GATE_POLICY` with ``model`` (None = analytic)."""
    return route_figures(replay(trace, config, cost_model=model).requests["actual_ttft_s"].to_numpy())


def replay_gate(window: ReplayWindow) -> RoutingGate:
    """A routing gate for :func:`~kvcost.models.mlflow_store.promote` that replays ``window`` with each model.

    The window is loaded when the gate is asked (an unknown trace fails then, before any alias moves).
    Passes when the challenger's TTFT P50 and P99 are each ≤ the champion's.
    """

    def gate(challenger: TermModelSet, champion: TermModelSet | None) -> RoutingVerdict:
        trace, start_s = window.load()
        router = RouterSettings(policy=GATE_POLICY)
        config = ClusterConfig(fleet=("a100",) * window.workers, seed=window.seed, router=router)
        figures = {"challenger": replay_figures(trace, config, challenger)}
        figures["champion"] = replay_figures(trace, config, champion)
        new, old = figures["challenger"], figures["champion"]
        passed = routes_no_worse(new, old)
        against = "the champion" if champion is not None else "the analytic model (no loadable champion)"
        note = (
            f"replay of {window.trace} from {start_s:g} s ({len(trace)} requests, {window.workers} workers, "
            f"rate scale {window.rate_scale:g}): TTFT P50 / P99 {new['ttft_p50_s']:.3f} / {new['ttft_p99_s']:.3f} s "
            f"vs {old['ttft_p50_s']:.3f} / {old['ttft_p99_s']:.3f} s with {against}"
        )
        return RoutingVerdict(passed, figures, note)

    return gate
