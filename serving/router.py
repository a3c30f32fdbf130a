"""The embedded router: the one routing code path used by the simulator and (later) the API.

For each request: look up the directory, build one feature row per candidate,
predict the TTFT terms, compose them on the critical path, apply the
hot-spot skew limit, and let the configured policy choose. Every decision
carries its full per-candidate breakdown for the log.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from kvcost.features.build import build_features
from kvcost.features.nominal import NominalCosts
from kvcost.models.hardware import StepTimeModel
from kvcost.models.term_set import TermModelSet
from kvcost.serving.directory import CacheDirectory, reusable_tokens_for
from kvcost.serving.policies import PolicyContext, make_policy
from kvcost.serving.types import RouteDecision, RouteRequest, WorkerSnapshot

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RouterSettings:
    """Router configuration.

    Attributes:
        policy: registered policy name (``round_robin``, ``least_loaded``, ``cost_aware``).
        skew_window_requests: decisions in the hot-spot window (≥ 1).
        max_share_over_mean: a worker whose share of the window's routed input
            tokens exceeds ``(1 + max_share_over_mean) / n_workers`` is excluded
            for ``cost_aware`` (unless every worker is). ≥ 0.
        costs: nominal per-request costs (lookup, first token, expected decode tokens).
    """

    policy: str = "cost_aware"
    skew_window_requests: int = 64
    max_share_over_mean: float = 1.0
    costs: NominalCosts = field(default_factory=NominalCosts)

    def __post_init__(self) -> None:
        if self.skew_window_requests < 1:
            raise ValueError(f"skew_window_requests = {self.skew_window_requests}, expected an integer ≥ 1")
        if not self.max_share_over_mean >= 0:
            raise ValueError(f"max_share_over_mean = {self.max_share_over_mean}, expected a number ≥ 0")


def load_tokens(snapshots: Sequence[WorkerSnapshot], expected_decode_tokens: int) -> np.ndarray:
    """Outstanding work per worker in tokens: queued prefill + running × expected decode tokens. ``(n,)`` float64."""
    return np.array(
        [s.queued_prefill_tokens + s.running_requests * expected_decode_tokens for s in snapshots],
        dtype=np.float64,
    )


class Router:
    """Cache- and load-aware router.

    Args:
        directory: the cache directory it reads (fed elsewhere by KV events).
        step_models: nominal step-time model per GPU type name.
        settings: policy and limits.
        cost_model: per-term predictor of the candidates' TTFT, a
            :class:`~kvcost.models.term_set.TermModelSet` (or anything with ``predict``,
            ``calibrate`` and ``learned``). None = the analytic model.
            ``learned_cost_aware`` without a learned model falls back to the
            analytic one and says so once (a log warning and ``fallbacks``).

    Thread safety: not thread-safe (the skew window and stateful policies
    change on every decision); one router per event loop.
    """

    def __init__(
        self,
        directory: CacheDirectory,
        step_models: Mapping[str, StepTimeModel],
        settings: RouterSettings,
        cost_model: object | None = None,
    ) -> None:
        self.directory = directory
        self.step_models = dict(step_models)
        self.settings = settings
        self.policy = make_policy(settings.policy)
        self.fallbacks = 0
        self.cost_model = TermModelSet.analytic()
        self.set_cost_model(cost_model)
        self._window: deque[tuple[int, int]] = deque(maxlen=settings.skew_window_requests)
        self._window_tokens: dict[int, int] = {}

    def set_cost_model(self, cost_model: TermModelSet | None) -> None:
        """Swap the cost model (e.g. newly retrained models); None = the analytic model."""
        if cost_model is None and self.settings.policy == "learned_cost_aware" and not self.fallbacks:
            _log.warning("learned_cost_aware has no learned model: routing with the analytic model")
            self.fallbacks += 1
        self.cost_model = cost_model if cost_model is not None else TermModelSet.analytic()

    def route(
        self,
        request: RouteRequest,
        snapshots: Sequence[WorkerSnapshot],
        now_s: float,
        true_ttft_s: Callable[[], np.ndarray] | None = None,
    ) -> RouteDecision:
        """Choose a worker for ``request`` among ``snapshots`` (non-empty).

        Args:
            request: the request.
            snapshots: candidate workers' load.
            now_s: decision time.
            true_ttft_s: replay only: the simulator's true TTFT per candidate (for ``oracle``).

        Raises:
            ValueError: no candidates.
        """
        if not snapshots:
            raise ValueError("snapshots is empty, expected at least one candidate worker")
        worker_ids = tuple(s.worker_id for s in snapshots)
        matches = self.directory.match(request.namespace, request.block_hashes, worker_ids, now_s)
        block_size = request.namespace.block_size_tokens
        reusable = np.array(
            [reusable_tokens_for(m.reusable_blocks, block_size, request.input_tokens) for m in matches],
            dtype=np.int64,
        )
        features = build_features(request, snapshots, matches, reusable, self.step_models, self.settings.costs)
        predictions = self.cost_model.predict(features)
        calibrated = self.cost_model.calibrate(predictions) if self.cost_model.learned else None
        ctx = PolicyContext(
            request=request,
            snapshots=tuple(snapshots),
            reusable_tokens=reusable,
            predictions=predictions,
            load_tokens=load_tokens(snapshots, self.settings.costs.expected_decode_tokens),
            allowed=self._skew_allowed(worker_ids),
            now_s=now_s,
            matches=tuple(matches),
            step_models=self.step_models,
            features=features,
            calibrated=calibrated,
            true_ttft_s=true_ttft_s,
        )
        index, reason = self.policy.choose(ctx)
        on_routed = getattr(self.policy, "on_routed", None)
        if on_routed is not None:
            on_routed(ctx, index)
        self._record(worker_ids[index], request.input_tokens)
        return RouteDecision(
            request_id=request.request_id,
            worker_id=worker_ids[index],
            chosen_index=index,
            worker_ids=worker_ids,
            reason=reason,
            matches=tuple(matches),
            reusable_tokens=reusable,
            features=features,
            predictions=predictions,
            calibrated=calibrated,
        )

    def _skew_allowed(self, worker_ids: tuple[int, ...]) -> np.ndarray:
        total = sum(self._window_tokens.values())
        if total == 0:
            return np.ones(len(worker_ids), dtype=bool)
        cap = (1.0 + self.settings.max_share_over_mean) / len(worker_ids)
        allowed = np.array([self._window_tokens.get(w, 0) / total <= cap for w in worker_ids])
        return allowed if allowed.any() else np.ones(len(worker_ids), dtype=bool)

    def _record(self, worker_id: int, tokens: int) -> None:
        if len(self._window) == self._window.maxlen:
            old_worker, old_tokens = self._window[0]
            self._window_tokens[old_worker] -= old_tokens
        self._window.append((worker_id, tokens))
        self._window_tokens[worker_id] = self._window_tokens.get(worker_id, 0) + tokens
