"""The embedded router: the one routing code path used by the simulator and (later) the API.

For each request: look up the directory, build one feature row per candidate,
predict the TTFT terms, compose them on the critical path, apply the
hot-spot skew limit, and let the configured policy choose. Every decision
carries its full per-candidate breakdown for the log.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from kvcost.calibration.adaptive_conformal import AdaptiveConformalScale, ServedBounds
from kvcost.core.composition import CalibratedTTFT, TermPredictions
from kvcost.core.hardware import StepTimeModel
from kvcost.core.types import (
    REMOTE_STORE_ID,
    DirectoryMatch,
    Namespace,
    ReusePlan,
    RouteDecision,
    RouteRequest,
    WorkerSnapshot,
    reusable_tokens_for,
)
from kvcost.features.build import KV_WAIT_SD_COLUMN, feature_columns, stack_features
from kvcost.features.decode_length import OutputLengthEstimate
from kvcost.features.nominal import NominalCosts
from kvcost.models.term_set import TermModelSet
from kvcost.routing.compatibility import conversion_factor, serves
from kvcost.routing.directory import CacheDirectory
from kvcost.routing.policies import PolicyContext, check_policy_params, make_policy
from kvcost.routing.promise_survival import expected_reuse_tokens
from kvcost.routing.routed_index import InFlightPrefixes
from kvcost.routing.skew import keep_prefix_holders

_log = logging.getLogger(__name__)

IN_FLIGHT_TTL_FACTOR = 2.0
"""An in-flight prefix is forgotten this many predicted TTFTs (of the request that carries it) after
routing, if the directory has not reported it stored by then. The predicted TTFT is when that request's
prompt blocks should all be stored (prefill ends at the first token); twice it leaves room for a
queue the model underestimated and for the KV events' lag, while a prefix whose request was
dropped or whose blocks were evicted before being reported stops counting soon after."""


class NoCompatibleCandidate(ValueError):  # noqa: N818  (a ValueError, as the router raised before)
    """No candidate serves the request's namespace (the message names it and the candidates' namespaces)."""


@dataclass(frozen=True, slots=True)
class RouterSettings:
    """Router configuration.

    Attributes:
        policy: registered policy name (``round_robin``, ``least_loaded``, ``cost_aware``).
        skew_window_requests: decisions in the hot-spot window (≥ 1).
        max_share_over_mean: a worker whose share of the window's routed input
            tokens exceeds ``(1 + max_share_over_mean) / n_workers`` is excluded
            for ``cost_aware`` (unless every worker is). ≥ 0; ``inf`` (the default)
            turns the limit off. Off by default since the router counts in-flight
            prefixes: the queue term then sees a hot worker's routed work and the
            reuse it brings, so a share cap that ignores both only adds prefill
            (kvcost issue 13 grid, ``docs/routing-unseen-workloads.md``: geometric
            mean of P99 ÷ best anchor 0.887 with the limit at 1, 0.821 without,
            over 27 cells of 5 workloads).
        costs: nominal per-request costs (lookup, first token, expected decode tokens, links).
        tiers: count prefixes held in the workers' CPU and disk tiers as reusable (paying
            their load time in L), not only GPU-resident ones.
        transfers: also consider fetching the longest compatible prefix from another
            worker or the remote store (paying X, overlapped with the queue); needs ``tiers``.
        count_in_flight: ``cost_aware``-family policies also count, as GPU-resident, the prefixes
            the router routed to a worker that the directory does not report stored yet
            (FCFS: the earlier request stores them before this one's first chunk; its work is
            in the queue term anyway). See :class:`~kvcost.routing.routed_index.InFlightPrefixes`.
            On by default: it holds on any workload where a family's requests arrive
            faster than one is served (bursts, agent loops, busy conversations), and
            costs nothing where they do not (measurements: ``docs/routing-unseen-workloads.md``).
        count_promise_survival: with ``count_in_flight``, each decision also carries the reuse expected
            to survive until admission (``RouteDecision.expected_reuse_tokens``,
            :mod:`~kvcost.routing.promise_survival`), and the callers count a queued request's work net
            of that, not of its promise. On by default: level on the A100 grid, lower where memory is
            short (``docs/routing-unseen-workloads.md``, "Where promises die").
        in_flight_min_ttl_s: an in-flight prefix is kept at least this long (seconds, ≥ 0) besides
            :data:`IN_FLIGHT_TTL_FACTOR` predicted TTFTs. 0 in replays (the simulated engine runs
            as its profile predicts); the service sets it (``ServiceSettings.in_flight_min_ttl_s``)
            because a live engine may run far slower than the profile of the model and GPU
            kvcost was told, and a request leaves the index anyway with its outcome (:meth:`Router.on_outcome`).
        in_flight_release_grace_s: an in-flight prefix stays this long (seconds, ≥ 0) after its last
            request's outcome, then leaves. 0 in replays (the simulated directory hears a store as it
            happens); the service sets it (``ServiceSettings.in_flight_release_grace_s``) because a live
            engine's KV event for the blocks a request stored reaches the directory after the request's
            first token reaches the gateway, and in between neither index held them (``make e2e``: a
            request in the run's first second hit a block both missed; a second salted request sent
            right after the first found the directory empty while it ingested the run's events).
        policy_params: keyword parameters of the policy, ``(name, value)`` pairs, e.g.
            ``(("duplicate_price_weight", 0.0),)`` to rank ``cost_aware`` without its duplicate price
            (the ablations of ``docs/routing-unseen-workloads.md``). Empty by default: every policy's
            own defaults. Each name must be a keyword parameter of ``policy`` (checked here).
        overdue_bounds_are_misses: a routed request that has waited past its served P90 bound
            with no outcome counts as a miss of the bounds' conformal factor at the next decision
            (:class:`~kvcost.calibration.adaptive_conformal.ServedBounds`), not only when its first
            token comes. Right where every routed request's outcome is reported (replays, the
            gateway); the plain ``/v1/route`` API turns it off, since a client may never observe
            some requests, and those would all count as misses.
    """

    policy: str = "cost_aware"
    skew_window_requests: int = 64
    max_share_over_mean: float = math.inf
    costs: NominalCosts = field(default_factory=NominalCosts)
    tiers: bool = False
    transfers: bool = False
    count_in_flight: bool = True
    count_promise_survival: bool = True
    in_flight_min_ttl_s: float = 0.0
    in_flight_release_grace_s: float = 0.0
    overdue_bounds_are_misses: bool = True
    policy_params: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if self.policy_params:
            check_policy_params(self.policy, self.policy_params)
        for name in ("in_flight_min_ttl_s", "in_flight_release_grace_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} = {getattr(self, name)}, expected a number ≥ 0")
        if self.skew_window_requests < 1:
            raise ValueError(f"skew_window_requests = {self.skew_window_requests}, expected an integer ≥ 1")
        if not self.max_share_over_mean >= 0:
            raise ValueError(f"max_share_over_mean = {self.max_share_over_mean}, expected a number ≥ 0")
        if self.transfers and not self.tiers:
            raise ValueError("transfers = True needs tiers = True (fetched KV is staged in a worker's CPU tier)")


def outstanding_tokens(queued_prefill_tokens: np.ndarray, running_requests: np.ndarray, expected_decode_tokens: int):
    """Outstanding work per worker in tokens, counting tokens not requests: queued prefill + running ×
    expected decode tokens, float64 ``(n,)`` (the ``load_tokens`` the policies see)."""
    return queued_prefill_tokens + running_requests * expected_decode_tokens


def compatible_candidates(namespace: Namespace, snapshots: Sequence[WorkerSnapshot]) -> Sequence[WorkerSnapshot]:
    """The candidates that can serve ``namespace`` (``snapshots`` itself when all can; see
    :func:`~kvcost.routing.compatibility.serves`); the router's one compatibility filter.

    Raises:
        NoCompatibleCandidate: none serves the namespace's model, revision, adapter and block size.
    """
    compatible = [s for s in snapshots if serves(s.namespace, namespace)]
    if not compatible:
        raise NoCompatibleCandidate(
            f"no candidate serves namespace model={namespace.model!r} revision={namespace.revision!r} "
            f"adapter={namespace.adapter!r} block_size_tokens={namespace.block_size_tokens}: candidates' "
            f"namespaces are {sorted({str(s.namespace) for s in snapshots})}"
        )
    return compatible if len(compatible) < len(snapshots) else snapshots


def _fetch_reason(plan: ReusePlan, ctx: PolicyContext, local_s: float, index: int) -> str:
    """Why a fetch won: what moves from where, and its predicted TTFT against the worker's own tiers."""
    source = "the remote store" if plan.source_id == REMOTE_STORE_ID else f"worker {plan.source_id}"
    conversion = " with layout conversion" if plan.conversion_factor else ""
    score = ctx.predictions.ttft_s[index]
    return (
        f"fetch {plan.fetch_blocks} blocks from {source}{conversion}: "
        f"{score * 1e3:.1f} ms vs {local_s * 1e3:.1f} ms with its own tiers"
    )


def _with_in_flight(match: DirectoryMatch, in_flight_blocks: int) -> DirectoryMatch:
    """``match``, or a GPU-tier match of ``in_flight_blocks`` when those are more (FCFS: stored at admission)."""
    if in_flight_blocks <= match.reusable_blocks:
        return match
    return replace(match, reusable_blocks=in_flight_blocks, tier="gpu")


class Router:
    """Cache- and load-aware router.

    Args:
        directory: the cache directory it reads (fed elsewhere by KV events).
        step_models: nominal step-time model per GPU type name.
        settings: policy and limits.
        cost_model: per-term predictor of the candidates' TTFT, a
            :class:`~kvcost.models.term_set.TermModelSet` (or anything with ``predict``,
            ``calibrate`` and ``learned``). None = the analytic model.
            A ``learned`` policy (``learned_cost_aware``) without a learned model
            falls back to the analytic one and says so once (a log warning and ``fallbacks``);
            a policy with its own model (``own_model``: ``llmd_predicted_latency``) does not
            route on the term models, so it is not warned about.
        reads_from: read this other router's in-flight prefixes, served-bound factor and decode-length
            estimate and never change them (a scorer beside the routing router: it sees what was routed
            and observed, and scoring leaves no trace). None = keep its own.

    Served P90 bounds adapt online: when the cost model is learned, every candidate's
    calibrated P90 is multiplied by an adaptive conformal factor
    (:class:`~kvcost.calibration.adaptive_conformal.AdaptiveConformalScale`, target 90 %),
    updated by :meth:`on_outcome` with each request's TTFT against the bound served for it, or
    counted as a miss as soon as a routed request has waited past that bound
    (:class:`~kvcost.calibration.adaptive_conformal.ServedBounds`). Split-conformal
    bounds fitted once drift with the load (kvcost issue 13 §4: a champion's 90 % bound covered
    81.7 % on the next 1,700 s of the bundled trace). P50 is unchanged; the policies rank by the
    composed TTFT of the terms.

    Output lengths are estimated online too, from the requests that finished (:meth:`on_finished`,
    :class:`~kvcost.features.decode_length.OutputLengthEstimate`, starting from
    ``settings.costs.expected_decode_tokens``): the KV-wait feature takes the mean output length from
    it, the memory price the mean remaining output of a decoder.

    Thread safety: not thread-safe (the skew window and stateful policies
    change on every decision); one router per event loop.
    """

    def __init__(
        self,
        directory: CacheDirectory,
        step_models: Mapping[str, StepTimeModel],
        settings: RouterSettings,
        cost_model: object | None = None,
        reads_from: Router | None = None,
    ) -> None:
        self.directory = directory
        self.step_models = dict(step_models)
        self.settings = settings
        self.policy = make_policy(settings.policy, **dict(settings.policy_params))
        self.fallbacks = 0
        self.cost_model = TermModelSet.analytic()
        self.set_cost_model(cost_model)
        self._window: deque[tuple[int, int]] = deque(maxlen=settings.skew_window_requests)
        self._window_tokens: dict[int, int] = {}
        counts = settings.count_in_flight and self.policy.counts_in_flight
        own = InFlightPrefixes(directory.max_blocks_per_worker) if reads_from is None else reads_from.in_flight
        self.in_flight: InFlightPrefixes | None = own if counts else None
        self._clears_seen: dict[int, int] = {}  # the directory's clears per worker when last routed
        self.interval = AdaptiveConformalScale() if reads_from is None else reads_from.interval
        prior_tokens = settings.costs.expected_decode_tokens
        self.decode_lengths = OutputLengthEstimate(prior_tokens) if reads_from is None else reads_from.decode_lengths
        self._costs_at: tuple[int, NominalCosts] = (0, settings.costs)  # (completions seen, costs)
        self.served_bounds = ServedBounds(self.interval)
        self._records = reads_from is None  # in-flight prefixes and served bounds of what it routes

    def set_cost_model(self, cost_model: TermModelSet | None) -> None:
        """Swap the cost model (e.g. newly retrained models); None = the analytic model."""
        if cost_model is None and self.policy.learned and not self.policy.own_model and not self.fallbacks:
            _log.warning("%s has no learned model: routing with the analytic model", self.policy.name)
            self.fallbacks += 1
        self.cost_model = cost_model if cost_model is not None else TermModelSet.analytic()

    def route(
        self,
        request: RouteRequest,
        snapshots: Sequence[WorkerSnapshot],
        now_s: float,
        in_flight_ttl_s: float | None = None,
    ) -> RouteDecision:
        """Choose a worker for ``request`` among ``snapshots`` (non-empty).

        Args:
            request: the request.
            snapshots: candidate workers' load.
            now_s: decision time.
            in_flight_ttl_s: for a caller that reports every outcome (the gateway), the request's
                in-flight prefix is kept until it (:meth:`on_outcome`, :meth:`release_in_flight`), at most
                this many seconds. None: :data:`IN_FLIGHT_TTL_FACTOR` predicted TTFTs, at least
                ``in_flight_min_ttl_s`` (an API client may never report some outcomes).

        Raises:
            ValueError: no candidates.
            NoCompatibleCandidate: no candidate serves the request's namespace (a ``ValueError``).
        """
        if not snapshots:
            raise ValueError("snapshots is empty, expected at least one candidate worker")
        snapshots = compatible_candidates(request.namespace, snapshots)
        worker_ids = tuple(s.worker_id for s in snapshots)
        namespaces = [self._namespace_of(request, s) for s in snapshots]
        matches = self._match(request, snapshots, namespaces, now_s)
        directory_blocks = tuple(m.reusable_blocks for m in matches)
        in_flight = self._in_flight(request, namespaces, matches, now_s)
        matches = [_with_in_flight(m, b) for m, b in zip(matches, in_flight, strict=True)]
        options = self._plans(request, snapshots, namespaces, in_flight) if self.settings.tiers else None
        reusable, features, predictions, calibrated, plans, local_score, load, kv_wait_sd = self._score(
            request, snapshots, matches, options
        )
        if calibrated is not None:
            if self._records and self.settings.overdue_bounds_are_misses:
                self.served_bounds.expire(now_s)
            calibrated = CalibratedTTFT(calibrated.p50_s, calibrated.p90_s * self.interval.factor)
        ctx = PolicyContext(
            request=request,
            snapshots=tuple(snapshots),
            reusable_tokens=reusable,
            predictions=predictions,
            load_tokens=load,
            allowed=self._skew_allowed(worker_ids, matches, predictions),
            now_s=now_s,
            matches=tuple(matches),
            step_models=self.step_models,
            features=features,
            calibrated=calibrated,
            remaining_decode_tokens=self.decode_lengths.remaining_tokens,
            kv_wait_sd_s=kv_wait_sd,
        )
        expected = self._expected_reuse(request, snapshots, namespaces, matches, in_flight, ctx)
        index, reason = self.policy.choose(ctx)
        if plans and plans[index].option == "fetch":
            reason += "; " + _fetch_reason(plans[index], ctx, local_score[index], index)
        self.policy.on_routed(ctx, index)
        self._record(worker_ids[index], request.input_tokens)
        if calibrated is not None and self._records:
            self.served_bounds.add(request.request_id, float(calibrated.p90_s[index]), now_s)
        if self.in_flight is not None and self._records:
            ttl_s = in_flight_ttl_s
            if ttl_s is None:
                ttl_s = max(self.settings.in_flight_min_ttl_s, IN_FLIGHT_TTL_FACTOR * float(predictions.ttft_s[index]))
            namespace, worker_id = namespaces[index], worker_ids[index]
            first_s = now_s + float(predictions.ttft_s[index])
            self.in_flight.add(namespace, worker_id, request.block_hashes, now_s + ttl_s, request.request_id, first_s)
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
            plans=plans,
            directory_blocks=directory_blocks,
            expected_reuse_tokens=expected,
        )

    def _expected_reuse(self, request, snapshots, namespaces, matches, in_flight, ctx) -> np.ndarray | None:
        """:func:`~kvcost.routing.promise_survival.expected_reuse_tokens` per candidate, or None where the
        router does not count in-flight prefixes or ``count_promise_survival`` is off."""
        if self.in_flight is None or not self.settings.count_promise_survival:
            return None
        index = self.in_flight
        deepest = [request.block_hashes[b - 1] if b else None for b in in_flight]  # deepest in-flight block
        siblings = [
            (index.first_token_s(ns, m.worker_id, h), index.holders(ns, m.worker_id, h)) if h is not None else (None, 0)
            for ns, m, h in zip(namespaces, matches, deepest, strict=True)
        ]
        promised = [m.reusable_blocks for m in matches]
        law = (self.decode_lengths.mean_tokens, self.decode_lengths.squared_cv)
        return expected_reuse_tokens(
            request, snapshots, ctx.reusable_tokens, promised, in_flight, siblings, ctx.features,
            ctx.predictions.queue_s, self.step_models, law, ctx.now_s,
        )  # fmt: skip

    def on_outcome(self, request_id: int, ttft_s: float, now_s: float) -> None:
        """A routed request's first token came ``ttft_s`` seconds after its arrival: update the policy
        (:meth:`RouterPolicy.on_outcome`) and the served bounds' conformal factor (when a bound was served),
        and take its prefix out of the in-flight index (it is stored, and held while the request runs)."""
        self.policy.on_outcome(request_id, ttft_s, now_s)
        self.served_bounds.resolve(request_id, ttft_s)
        self.release_in_flight(request_id, True, now_s)

    def release_in_flight(self, request_id: int, stored: bool, now_s: float) -> None:
        """Request ``request_id``'s prefix leaves the in-flight index: after the release grace when
        ``stored`` (its first token came, or it was answered whole), else at once (it ended before its
        first token: what the engine stored of it, a KV event reports). An unknown id does nothing."""
        if self.in_flight is not None and self._records:
            grace_s = self.settings.in_flight_release_grace_s
            self.in_flight.release(request_id, now_s + grace_s if stored and grace_s > 0 else None)

    def on_finished(self, output_tokens: int) -> None:
        """A routed request finished with ``output_tokens`` generated tokens (an integer ≥ 0): count it in
        :attr:`decode_lengths`, the output-length estimate of the KV-wait feature (its mean) and of the
        memory price (the remaining output of a decoder). A router that reads another's state
        (``reads_from``) changes nothing.

        Raises:
            ValueError: ``output_tokens`` negative or not an integer (nothing is counted).
        """
        if self._records:
            self.decode_lengths.observe(output_tokens)

    # -- candidates, directory and options --------------------------------------------------------

    @staticmethod
    def _namespace_of(request: RouteRequest, snapshot: WorkerSnapshot) -> Namespace:
        """The directory namespace of the worker's KV: the request's, in the worker's KV layout."""
        if snapshot.namespace is None or snapshot.namespace.kv_layout == request.namespace.kv_layout:
            return request.namespace
        return replace(request.namespace, kv_layout=snapshot.namespace.kv_layout)

    def _match(
        self, request: RouteRequest, snapshots, namespaces: list[Namespace], now_s: float
    ) -> list[DirectoryMatch]:
        """Directory match per candidate, each in its own KV layout's namespace (``namespaces``, per candidate)."""
        found: dict[int, DirectoryMatch] = {}
        for namespace, indices in _grouped(namespaces, range(len(snapshots))):
            ids = [snapshots[i].worker_id for i in indices]
            for match in self.directory.match(namespace, request.block_hashes, ids, now_s):
                found[match.worker_id] = match
        return [found[s.worker_id] for s in snapshots]

    def _in_flight(
        self, request: RouteRequest, namespaces: list[Namespace], matches: list[DirectoryMatch], now_s: float
    ) -> list[int]:
        """Leading blocks of the request in flight to each candidate (all 0 when not counted).

        Expired entries go first, and those of a worker whose engine restarted since (the
        directory cleared it); a worker whose engine does not answer (directory unknown) counts
        none, as its directory entries count none. Requests leave the index with their outcome
        (:meth:`on_outcome`).
        """
        if self.in_flight is None:
            return [0] * len(matches)
        self.in_flight.expire(now_s)
        known = []
        for i, match in enumerate(matches):
            clears = self.directory.clears(match.worker_id)
            if self._clears_seen.get(match.worker_id, 0) != clears:
                self.in_flight.forget_worker(match.worker_id)
                self._clears_seen[match.worker_id] = clears
            if not self.directory.is_unknown(match.worker_id):
                known.append(i)
        blocks = [0] * len(matches)
        for namespace, indices in _grouped(namespaces, known):
            ids = [matches[i].worker_id for i in indices]
            for i, n in zip(indices, self.in_flight.match(namespace, request.block_hashes, ids), strict=True):
                blocks[i] = n
        return blocks

    def _plans(
        self, request: RouteRequest, snapshots, namespaces: list[Namespace], in_flight: list[int]
    ) -> tuple[list[ReusePlan], list[int]]:
        """Every option per candidate: its own tiers (``local``), and a ``fetch`` of a longer prefix.

        ``namespaces``: each candidate's directory namespace (:meth:`_namespace_of`);
        ``in_flight``: blocks in flight to each candidate, counted as GPU-resident (:meth:`_in_flight`).

        Returns:
            ``(plans, owners)``: ``local`` plans first (one per candidate, in order), then
            one ``fetch`` plan per candidate for which a compatible source (another
            candidate, or the remote store, in any convertible layout) holds a longer
            prefix than the candidate's own tiers; ``owners[k]`` is the candidate index
            of ``plans[k]``. The longest source wins, ties to the cheaper conversion,
            then the remote store, then the lowest worker id.
        """
        depths: dict[tuple[str, int], tuple[int, int, int]] = {}  # (layout, holder) -> (gpu, cpu, any)
        for namespace in set(namespaces):
            holders = [s.worker_id for s, ns in zip(snapshots, namespaces, strict=True) if ns == namespace]
            if self.settings.transfers:
                holders.append(REMOTE_STORE_ID)
            for holder, depth in self.directory.match_tiers(namespace, request.block_hashes, holders).items():
                depths[(namespace.kv_layout, holder)] = depth
        plans = []
        for s, namespace in zip(snapshots, namespaces, strict=True):
            gpu, cpu, any_tier = depths[(namespace.kv_layout, s.worker_id)]
            gpu = max(gpu, in_flight[len(plans)])
            cpu, any_tier = max(cpu, gpu), max(any_tier, gpu)
            plans.append(ReusePlan("local", gpu, cpu - gpu, any_tier - cpu))
        owners = list(range(len(snapshots)))
        if not self.settings.transfers:
            return plans, owners
        for i, (s, local) in enumerate(zip(snapshots, list(plans), strict=True)):
            fetch = self._best_source(namespaces[i].kv_layout, s.worker_id, depths)
            if fetch is not None and fetch[0] > local.reusable_blocks:
                depth, factor, source = fetch
                extra = depth - local.reusable_blocks
                plans.append(
                    replace(local, option="fetch", fetch_blocks=extra, source_id=source, conversion_factor=factor)
                )
                owners.append(i)
        return plans, owners

    @staticmethod
    def _best_source(layout: str, worker_id: int, depths) -> tuple[int, float, int] | None:
        """``(blocks, conversion_factor, source_id)`` of the longest prefix ``worker_id`` could fetch."""
        best = None
        for (source_layout, source), (_, _, blocks) in depths.items():
            if source == worker_id or not blocks:
                continue
            factor = conversion_factor(source_layout, layout)
            if factor is None:
                continue
            key = (blocks, -factor, source == REMOTE_STORE_ID, -source)
            if best is None or key > best[0]:
                best = (key, (blocks, factor, source))
        return best[1] if best is not None else None

    def _score(self, request: RouteRequest, snapshots, matches, options):
        """Predict every option in one call; keep each candidate's best one (by the routing score).

        The score is the composed TTFT of the predicted terms, as the cost-aware policies
        rank by it (learned or analytic; the calibration is for reporting).

        Returns:
            ``(reusable_tokens, features, predictions, calibrated, plans, local_score, load_tokens,
            kv_wait_sd_s)`` per candidate; ``plans`` is ``()`` and ``local_score`` None when the router
            plans GPU-resident prefixes only, else ``local_score`` is each candidate's score with its own
            tiers (the alternative a fetch beat), seconds. ``load_tokens`` is :func:`outstanding_tokens`
            from the feature columns (the queues are summed once); ``kv_wait_sd_s`` the column
            :data:`~kvcost.features.build.KV_WAIT_SD_COLUMN` of each kept option.
        """
        n = len(snapshots)
        block_size = request.namespace.block_size_tokens
        plans = None
        if options is None:
            blocks = [m.reusable_blocks for m in matches]
            row_snapshots, row_matches = snapshots, matches
        else:
            plans, owner = options
            blocks = [p.reusable_blocks for p in plans]
            row_snapshots = [snapshots[i] for i in owner]
            row_matches = [matches[i] for i in owner]
        reusable = np.array([reusable_tokens_for(b, block_size, request.input_tokens) for b in blocks], dtype=np.int64)
        columns = feature_columns(request, row_snapshots, row_matches, reusable, self.step_models, self._costs(), plans)
        features = stack_features(columns)
        # rows 0..n-1 are the candidates in order (their own-tier options): their snapshot columns
        expected = self.settings.costs.expected_decode_tokens
        load = outstanding_tokens(columns["queued_prefill_tokens"][:n], columns["running_requests"][:n], expected)
        predictions = self.cost_model.predict(features)
        calibrated = self.cost_model.calibrate(predictions) if self.cost_model.calibrated else None
        kv_wait_sd = columns[KV_WAIT_SD_COLUMN]
        if plans is None:
            return reusable, features, predictions, calibrated, (), None, load, kv_wait_sd
        score = predictions.ttft_s
        best = list(range(n))
        for row in range(n, len(plans)):
            i = owner[row]
            if score[row] < score[best[i]]:
                best[i] = row
        index = np.array(best)
        chosen_calibrated = None
        if calibrated is not None:
            chosen_calibrated = CalibratedTTFT(calibrated.p50_s[index], calibrated.p90_s[index])
        chosen_plans = tuple(plans[i] for i in best)
        chosen = (reusable[index], features[index], predictions.take(index), chosen_calibrated, chosen_plans)
        return (*chosen, score[:n], load, kv_wait_sd[index])

    def _costs(self) -> NominalCosts:
        """The nominal costs the features are computed with: the settings' costs, with the mean output
        length and its squared coefficient of variation (the rate and law by which decoders finish,
        for the KV-wait feature) from :attr:`decode_lengths`.

        ``load_tokens`` (:func:`outstanding_tokens`) keeps the settings' fixed
        ``expected_decode_tokens``: it is ``least_loaded``'s stated rule and what the bench's load
        levels are calibrated with."""
        observed = self.decode_lengths.observed
        if not observed:
            return self.settings.costs
        if self._costs_at[0] != observed:  # one copy per completion, not per decision
            lengths = self.decode_lengths
            costs = replace(
                self.settings.costs, mean_output_tokens=lengths.mean_tokens, output_tokens_cv2=lengths.squared_cv
            )
            self._costs_at = (observed, costs)
        return self._costs_at[1]

    def _skew_allowed(
        self,
        worker_ids: tuple[int, ...],
        matches: Sequence[DirectoryMatch],
        predictions: TermPredictions,
    ) -> np.ndarray:
        """Which candidates the hot-spot skew limit allows, bool ``(n,)`` (never all False).

        A worker whose share of the window's routed input tokens exceeds
        ``(1 + max_share_over_mean) / n`` is excluded (everyone is allowed when
        everyone is over), except a prefix holder that would not queue longer:
        see :func:`keep_prefix_holders`.
        """
        total = sum(self._window_tokens.values())
        if total == 0 or math.isinf(self.settings.max_share_over_mean):
            return np.ones(len(worker_ids), dtype=bool)
        cap = (1.0 + self.settings.max_share_over_mean) / len(worker_ids)
        allowed = np.array([self._window_tokens.get(w, 0) / total <= cap for w in worker_ids])
        if not allowed.any():
            return np.ones(len(worker_ids), dtype=bool)
        blocks = np.array([m.reusable_blocks for m in matches], dtype=np.int64)
        return keep_prefix_holders(allowed, blocks, predictions.queue_s, predictions.ttft_s)

    def _record(self, worker_id: int, tokens: int) -> None:
        if len(self._window) == self._window.maxlen:
            old_worker, old_tokens = self._window[0]
            self._window_tokens[old_worker] -= old_tokens
        self._window.append((worker_id, tokens))
        self._window_tokens[worker_id] = self._window_tokens.get(worker_id, 0) + tokens


def _grouped(namespaces: Sequence[Namespace], indices) -> list[tuple[Namespace, list[int]]]:
    """The candidate ``indices`` grouped by their namespace (``namespaces[i]``), in first-seen order,
    so that the directory and the in-flight index are read once per namespace. Grouped by identity
    (a decision's candidates share the request's namespace object; an equal copy only costs one
    more read), because hashing a :class:`Namespace` per candidate costs more than the read."""
    groups: dict[int, tuple[Namespace, list[int]]] = {}
    for i in indices:
        namespace = namespaces[i]
        groups.setdefault(id(namespace), (namespace, []))[1].append(i)
    return list(groups.values())
