"""The service's routing: request bodies resolved into a ``RouteRequest`` and snapshots, scored, routed, remembered.

:class:`Routing` holds the two embedded :class:`~kvcost.routing.router.Router`
objects over the service's one directory (the routing router with the
configured policy; a stateless ``cost_aware`` scorer for ``/v1/score``), the
last snapshot pushed per worker, and the :class:`DecisionStore` that
``/v1/observe`` joins actual times to.

Thread safety: call from one event loop; routing and scoring hold the
service's ``lock`` while they read the directory.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kvcost.core.hardware import StepTimeModel
from kvcost.core.types import Namespace, RouteDecision, RouteRequest, WorkerSnapshot
from kvcost.models.term_set import TermModelSet
from kvcost.routing.block_hash import PrefixHashCache, block_hashes_for
from kvcost.routing.directory import CacheDirectory
from kvcost.routing.router import NoCompatibleCandidate, Router, RouterSettings
from kvcost.serving.errors import ConflictError, FieldError
from kvcost.serving.schemas import (
    CandidateScore,
    NamespaceIn,
    RouteResponse,
    ScoreRequestIn,
    ScoreResponse,
    SnapshotAck,
    SnapshotIn,
    TermsOut,
)
from kvcost.serving.settings import ServiceSettings, parse_kv_event_source


@dataclass(slots=True)
class DecisionRecord:
    """What ``/v1/observe`` needs of a decision (the full rows are in ``candidates``).

    Attributes:
        run_id: log run the decision belongs to.
        worker_id: chosen worker.
        input_tokens: prompt length.
        predicted_reuse_tokens: reusable prefix the directory promised on the chosen worker.
        predicted_s: the chosen worker's predicted terms (TERMS order) then TTFT, seconds.
        arrival_s: arrival, epoch seconds (None for a decision reloaded from the log).
        observed: an observation is committed.
        pending: the commit of an observation in flight.
    """

    run_id: str
    worker_id: int
    input_tokens: int
    predicted_reuse_tokens: int
    predicted_s: tuple[float, ...]
    arrival_s: float | None
    observed: bool = False
    pending: asyncio.Future | None = None

    def settle(self, future: asyncio.Future) -> None:
        """Done-callback of the observation commit: clear :attr:`pending`; :attr:`observed` if it committed."""
        self.pending = None
        if not future.cancelled() and future.exception() is None:
            self.observed = True


class DecisionStore:
    """The newest ``max_decisions`` decisions by request id (an LRU: the oldest is forgotten first)."""

    def __init__(self, max_decisions: int) -> None:
        self.max_decisions = max_decisions
        self._records: OrderedDict[int, DecisionRecord] = OrderedDict()

    def __len__(self) -> int:
        return len(self._records)

    def get(self, request_id: int) -> DecisionRecord | None:
        """The decision of ``request_id``, or None if never made or forgotten."""
        return self._records.get(request_id)

    def remember(self, request_id: int, record: DecisionRecord) -> None:
        """Store ``record`` as the newest decision, forgetting the oldest beyond ``max_decisions``."""
        self._records.pop(request_id, None)
        self._records[request_id] = record
        while len(self._records) > self.max_decisions:
            self._records.popitem(last=False)

    def reload(self, records: Iterable[tuple[int, DecisionRecord]]) -> None:
        """Remember ``(request_id, record)`` pairs given oldest first (a later one wins a reused id)."""
        for request_id, record in records:
            self.remember(request_id, record)


def _finite_or_none(value: float) -> float | None:
    value = float(value)
    return value if np.isfinite(value) else None


class Routing:
    """Routing and scoring of request bodies against the directory and the workers' snapshots.

    Args:
        settings: service settings (policy, tiers, block size, hashing, limits).
        directory: the service's cache directory (shared with the KV-event ingestor).
        lock: guards ``directory``; held while routing and scoring.
        step_models: step-time model per GPU type.
        clock: wall clock, epoch seconds.
    """

    def __init__(
        self,
        settings: ServiceSettings,
        directory: CacheDirectory,
        lock: threading.Lock,
        step_models: Mapping[str, StepTimeModel],
        clock: Callable[[], float],
    ) -> None:
        self.settings = settings
        self.lock = lock
        self.clock = clock
        self.step_models = dict(step_models)
        # analytic until the champion loads; the service reports any fallback itself (log, metric, /readyz)
        analytic = TermModelSet.analytic()
        routing = RouterSettings(
            policy=settings.policy,
            tiers=settings.tiers,
            in_flight_min_ttl_s=settings.in_flight_min_ttl_s,
            in_flight_release_grace_s=settings.in_flight_release_grace_s,
            overdue_bounds_are_misses=bool(settings.engines),  # the gateway observes every request it routes
        )
        self.router = Router(directory, self.step_models, routing, analytic)
        # Scores come from a second router over the same directory and cost model with the
        # stateless cost_aware policy: /v1/score never touches the routing router's skew
        # window or policy state, and shares every line of its scoring code. It reads the
        # routing router's in-flight prefixes (the reuse routed requests bring) and adds none.
        scoring = RouterSettings(policy="cost_aware", tiers=settings.tiers)
        self.scorer = Router(directory, self.step_models, scoring, analytic, reads_from=self.router)
        self._hash_cache = PrefixHashCache(settings.hash_cache_blocks) if settings.hash_cache_blocks else None
        #: Workers whose directory entries come from KV events (exact mode); every other worker's come
        #: from the prefixes routed to it, forgotten after ``routed_ttl_s`` (approximate mode).
        self.exact_workers = frozenset(parse_kv_event_source(spec).worker_id for spec in settings.kv_events)
        self._directory = directory
        self._lora_paths = settings.lora_paths()
        #: The last snapshot pushed per worker and when it arrived (epoch seconds).
        self.snapshots: dict[int, tuple[WorkerSnapshot, float]] = {}
        self.decisions = DecisionStore(settings.max_decisions)

    def set_cost_model(self, model_set: TermModelSet | None) -> None:
        """Install ``model_set`` in both routers (under the lock)."""
        with self.lock:
            for router in (self.router, self.scorer):
                router.set_cost_model(model_set)

    def on_outcome(
        self,
        request_id: int,
        ttft_s: float | None,
        now_s: float,
        stored: bool = True,
        finished_output_tokens: int | None = None,
    ) -> None:
        """What a routed request's outcome tells the routing router, under the lock.

        A TTFT (seconds) reaches its policy and served P90 bounds (:meth:`Router.on_outcome`); without
        one (``None``), its prefix leaves the in-flight index, after the release grace when ``stored``
        (answered whole) or at once (ended before its first token; :meth:`Router.release_in_flight`).
        ``finished_output_tokens``: the request finished with that many generated tokens, counted in
        the decode-length estimate the scorer reads too (:meth:`Router.on_finished`).
        """
        with self.lock:
            if ttft_s is not None:
                self.router.on_outcome(request_id, ttft_s, now_s)
            else:
                self.router.release_in_flight(request_id, stored, now_s)
            if finished_output_tokens is not None:
                self.router.on_finished(finished_output_tokens)

    # ------------------------------------------------------------------- scoring

    def score(self, body: ScoreRequestIn, model_label: str) -> ScoreResponse:
        """Score every candidate with the stateless scorer (the routing router is not touched).

        Raises:
            FieldError: a candidate without any snapshot, an unknown GPU type, more block hashes than tokens.
        """
        now_s = self.clock()
        request, snapshots, sources, ages = self.resolve(body, now_s)
        decision = self._route(self.scorer, request, snapshots, now_s)
        fields = score_fields(decision, request, sources, ages, model_label, self.directory_mode)
        unverified = namespace_unverified(decision, snapshots)
        return ScoreResponse(**fields, profile=self.profile_of(request), namespace_unverified=unverified)

    def route(self, body: ScoreRequestIn, run_id: str, model_label: str) -> tuple[RouteResponse, RouteDecision]:
        """Route the request and remember the decision; returns the response and the decision (to log).

        Raises:
            ConflictError: the request id was already routed (and is still remembered).
            FieldError: as :meth:`score`.
        """
        request_id = body.request.request_id
        known = self.decisions.get(request_id)
        if known is not None:
            raise ConflictError(
                f"request_id {request_id} was already routed (to worker {known.worker_id}, run {known.run_id}); "
                "request ids must be unique"
            )
        now_s = self.clock()
        request, snapshots, sources, ages = self.resolve(body, now_s)
        return self.decide(request, snapshots, sources, ages, run_id, model_label, now_s)

    def profile_of(self, request: RouteRequest) -> str:
        """The profile the request's step times come from: ``--model``'s when the request names the model the
        fleet serves (``--served-model-name``, else ``--model``), else ``fallback:<--model>``: one model per
        service, so another model's request is priced with it, and says so (never a silent substitute)."""
        served = {self.settings.model, self.settings.served_model_name or self.settings.model}
        model = self.settings.model
        return model if request.namespace.model in served else f"fallback:{model}"

    def directory_mode(self, worker_id: int) -> str:
        """``exact`` (the worker's KV events feed the directory) or ``approximate`` (routed prefixes, with a TTL)."""
        return "exact" if worker_id in self.exact_workers else "approximate"

    def decide(
        self,
        request: RouteRequest,
        snapshots: list[WorkerSnapshot],
        sources: Mapping[int, str],
        ages: Mapping[int, float],
        run_id: str,
        model_label: str,
        now_s: float,
        in_flight_ttl_s: float | None = None,
    ) -> tuple[RouteResponse, RouteDecision]:
        """Route a resolved request (see :meth:`resolve`), remember the decision; returns the response and it.

        ``in_flight_ttl_s``: the caller reports the outcome within this long (:meth:`Router.route`).

        In approximate mode the chosen worker is recorded as holding the request's blocks
        (:meth:`CacheDirectory.record_routed`), and blocks routed more than ``routed_ttl_s``
        ago are forgotten, as Dynamo's router does without KV events (its ``ApproxKvIndexer``).

        Raises:
            FieldError: no candidate serves the request's namespace.
        """
        decision = self._route(self.router, request, snapshots, now_s, in_flight_ttl_s)
        if decision.worker_id not in self.exact_workers:
            with self.lock:
                self._directory.expire_routed(now_s, self.settings.routed_ttl_s)
                self._directory.record_routed(request.namespace, decision.worker_id, request.block_hashes, now_s)
        index = decision.chosen_index
        pred = decision.predictions.as_matrix()
        record = DecisionRecord(
            run_id,
            decision.worker_id,
            request.input_tokens,
            int(decision.reusable_tokens[index]),
            tuple(float(x) for x in pred[index]),
            request.arrival_s,
        )
        self.decisions.remember(request.request_id, record)
        response = RouteResponse(
            **score_fields(decision, request, sources, ages, model_label, self.directory_mode),
            profile=self.profile_of(request),
            namespace_unverified=namespace_unverified(decision, snapshots),
            worker_id=decision.worker_id,
            chosen_index=index,
            policy=self.settings.policy,
            reason=decision.reason,
            run_id=run_id,
        )
        return response, decision

    def _route(
        self,
        router: Router,
        request: RouteRequest,
        snapshots: list[WorkerSnapshot],
        now_s: float,
        in_flight_ttl_s: float | None = None,
    ):
        """``router.route`` under the lock; the router's compatibility refusal as a ``candidates`` field error.

        Raises:
            FieldError: no candidate serves the request's namespace.
        """
        try:
            with self.lock:
                return router.route(request, snapshots, now_s, in_flight_ttl_s)
        except NoCompatibleCandidate as exc:
            raise FieldError(("candidates",), str(exc)) from None

    # ----------------------------------------------------------------- resolving

    def resolve(
        self, body: ScoreRequestIn, now_s: float
    ) -> tuple[RouteRequest, list[WorkerSnapshot], dict[int, str], dict[int, float]]:
        """The request, every candidate's snapshot, and per worker id its snapshot's source and age (s).

        Which candidates can serve the request's namespace is the router's to decide.

        Raises:
            FieldError: as :meth:`score`.
        """
        req = body.request
        ns = request_namespace(body, self.settings)
        block_size = ns.block_size_tokens
        if req.token_ids is not None:
            hashes = self._hashes(req.token_ids, ns, req.namespace.cache_salt)
            input_tokens = len(req.token_ids)
        else:
            hashes = tuple(req.block_hashes or ())
            input_tokens = int(req.input_tokens or 0)
            if len(hashes) > input_tokens // block_size:
                raise FieldError(
                    ("request", "block_hashes"),
                    f"{len(hashes)} full blocks of {block_size} tokens exceed input_tokens = {input_tokens}",
                )
        snapshots, sources, ages = self._candidate_snapshots(body, now_s)
        arrival_s = req.arrival_s if req.arrival_s is not None else now_s
        return RouteRequest(req.request_id, arrival_s, input_tokens, hashes, ns), snapshots, sources, ages

    def token_request(
        self, request_id: int, token_ids: Sequence[int], arrival_s: float, cache_salt: str | None = None
    ) -> RouteRequest:
        """The gateway's request: ``token_ids`` hashed as the engines hash them, in the engines' namespace.

        Args:
            request_id: the gateway's id of the decision.
            token_ids: the prompt's token ids, each in ``[0, 2**32)``.
            arrival_s: arrival at the gateway, epoch seconds.
            cache_salt: the request's ``cache_salt`` (vLLM hashes it into the first block), or None.
        """
        ns = self.settings.event_namespace()
        return RouteRequest(request_id, arrival_s, len(token_ids), self._hashes(token_ids, ns, cache_salt), ns)

    def _hashes(self, token_ids: Sequence[int], ns: Namespace, cache_salt: str | None) -> tuple[int, ...]:
        """``token_ids`` hashed as the engines hash them in namespace ``ns`` (see :func:`hash_tokens`)."""
        return hash_tokens(token_ids, ns, cache_salt, self.settings, self._hash_cache, self._lora_paths)

    def _candidate_snapshots(
        self, body: ScoreRequestIn, now_s: float
    ) -> tuple[list[WorkerSnapshot], dict[int, str], dict[int, float]]:
        """Each candidate's snapshot (inline or pushed) and, per worker id, its source and age (s)."""
        snapshots, sources, ages = [], {}, {}
        for i, candidate in enumerate(body.candidates):
            if candidate.snapshot is not None:
                snapshot = self.snapshot(candidate.worker_id, candidate.snapshot, ("candidates", i, "snapshot"))
                sources[candidate.worker_id] = "inline"
                ages[candidate.worker_id] = 0.0
            else:
                stored = self.snapshots.get(candidate.worker_id)
                if stored is None:
                    raise FieldError(
                        ("candidates", i, "snapshot"),
                        f"worker {candidate.worker_id} has no snapshot: send one inline or "
                        f"POST /v1/workers/{candidate.worker_id}/snapshot first",
                    )
                snapshot, received_s = stored
                sources[candidate.worker_id] = "pushed"
                ages[candidate.worker_id] = max(0.0, now_s - received_s)
            snapshots.append(snapshot)
        return snapshots, sources, ages

    def snapshot(self, worker_id: int, body: SnapshotIn, loc: tuple[str | int, ...]) -> WorkerSnapshot:
        """``body`` as the :class:`WorkerSnapshot` of ``worker_id``; ``loc`` prefixes error locations.

        Raises:
            FieldError: unknown GPU type (at ``loc + ("gpu",)``).
        """
        gpu = body.gpu if body.gpu is not None else self.settings.gpu_default  # "" is not a GPU type
        if gpu not in self.step_models:
            raise FieldError((*loc, "gpu"), f"gpu = {gpu!r}, expected one of {', '.join(sorted(self.step_models))}")
        return WorkerSnapshot(
            worker_id=worker_id,
            gpu=gpu,
            waiting_prefill=tuple((int(r), int(c)) for r, c in body.waiting_prefill),
            running_requests=body.running_requests,
            decode_context_tokens=body.decode_context_tokens,
            kv_usage=body.kv_usage,
            idle_cached_blocks=body.idle_cached_blocks,
            recent_step_s=body.recent_step_s,
            step_remaining_s=body.step_remaining_s,
            kv_capacity_blocks=body.kv_capacity_blocks,
            waiting_prompt_blocks=body.waiting_prompt_blocks,
            oldest_waiting_s=body.oldest_waiting_s,
            recent_step_nominal_s=body.recent_step_nominal_s,
            namespace=self._worker_namespace(body.namespace),
            running_output_tokens=tuple(body.running_output_tokens),
        )

    def _worker_namespace(self, body: NamespaceIn | None) -> Namespace | None:
        if body is None:
            return None
        block_size = body.block_size_tokens or self.settings.block_size_tokens
        return Namespace(body.model, body.revision, body.adapter, block_size, body.kv_layout)

    def push_snapshot(self, worker_id: int, body: SnapshotIn) -> SnapshotAck:
        """Store a worker's snapshot (replacing its previous one).

        Raises:
            FieldError: unknown GPU type. ConflictError: ``max_workers`` other workers already tracked.
        """
        snapshot = self.snapshot(worker_id, body, ())
        if worker_id not in self.snapshots and len(self.snapshots) >= self.settings.max_workers:
            raise ConflictError(f"{len(self.snapshots)} workers already tracked (max_workers); worker {worker_id}")
        now_s = self.clock()
        self.snapshots[worker_id] = (snapshot, now_s)
        return SnapshotAck(worker_id=worker_id, received_at_s=now_s)


def request_namespace(body: ScoreRequestIn, settings: ServiceSettings) -> Namespace:
    """The namespace a score / route body's request is matched in (the service's block size by default)."""
    req = body.request.namespace
    return Namespace(
        model=req.model,
        revision=req.revision,
        adapter=req.adapter,
        block_size_tokens=req.block_size_tokens or settings.block_size_tokens,
        kv_layout=req.kv_layout,
        # not cache_salt: vLLM hashes the salt into the first block, and its KV events do not
        # carry it, so salted blocks are stored (and found) in the unsalted namespace
    )


def hash_tokens(
    token_ids: Sequence[int],
    ns: Namespace,
    cache_salt: str | None,
    settings: ServiceSettings,
    cache: PrefixHashCache | None = None,
    lora_paths: Mapping[str, str] | None = None,
) -> tuple[int, ...]:
    """``token_ids`` hashed as the engines hash them in namespace ``ns``, with the service's hash algorithm,
    seed and extra keys (see :func:`block_hashes_for`); ``lora_paths`` default: ``settings.lora_paths()``."""
    paths = settings.lora_paths() if lora_paths is None else lora_paths
    return block_hashes_for(
        token_ids,
        ns.block_size_tokens,
        ns,
        settings.hash_algorithm,
        settings.hash_seed,
        cache,
        cache_salt=cache_salt,
        lora_path=paths.get(ns.adapter, ""),
        key_format=settings.hash_extra_keys,
    )


def with_block_hashes(body: ScoreRequestIn, settings: ServiceSettings) -> ScoreRequestIn:
    """``body`` with its ``token_ids`` replaced by their block hashes and ``input_tokens`` (as :meth:`Routing.resolve`
    would hash them): what a worker process sends back for a large body, so that the event loop does not hash."""
    req = body.request
    if req.token_ids is None:
        return body
    hashes = hash_tokens(req.token_ids, request_namespace(body, settings), req.namespace.cache_salt, settings)
    hashed = req.model_copy(
        update={"token_ids": None, "block_hashes": list(hashes), "input_tokens": len(req.token_ids)}
    )
    return body.model_copy(update={"request": hashed})


def namespace_unverified(decision: RouteDecision, snapshots: Sequence[WorkerSnapshot]) -> bool:
    """No scored candidate's snapshot declares a namespace (the router kept those that declare a compatible
    one, and those that declare none): the request's namespace was checked against no worker."""
    scored = set(decision.worker_ids)
    return not any(s.namespace is not None for s in snapshots if s.worker_id in scored)


def score_fields(
    decision: RouteDecision,
    request: RouteRequest,
    sources: Mapping[int, str],
    ages: Mapping[int, float],
    model_label: str,
    directory_mode: Callable[[int], str],
) -> dict:
    """The fields a score and a route response share: per-candidate terms, TTFT, P50/P90, reuse, snapshot age.

    ``sources`` and ``ages`` are per worker id (the router may have left incompatible candidates out);
    ``directory_mode`` names each worker's directory mode.
    """
    p = decision.predictions
    ttft = p.ttft_s
    calibrated = decision.calibrated
    p50 = calibrated.p50_s if calibrated is not None else ttft
    p90 = calibrated.p90_s if calibrated is not None else np.full_like(ttft, np.nan)
    expected = decision.queued_reuse()
    candidates = [
        CandidateScore(
            worker_id=worker_id,
            terms=TermsOut(
                queue_s=float(p.queue_s[i]),
                lookup_s=float(p.lookup_s[i]),
                transfer_s=float(p.transfer_s[i]),
                prefill_s=float(p.prefill_s[i]),
                first_token_s=float(p.first_token_s[i]),
            ),
            ttft_s=float(ttft[i]),
            p50_s=float(p50[i]),
            p90_s=_finite_or_none(p90[i]),
            score_s=float(ttft[i]),
            reusable_tokens=int(decision.reusable_tokens[i]),
            expected_reuse_tokens=int(expected[i]),
            reusable_blocks=decision.matches[i].reusable_blocks,
            tier=decision.matches[i].tier,
            directory_age_s=_finite_or_none(decision.matches[i].age_s),
            directory_stale=decision.matches[i].stale,
            directory_mode=directory_mode(worker_id),
            snapshot=sources[worker_id],
            snapshot_age_s=ages[worker_id],
        )
        for i, worker_id in enumerate(decision.worker_ids)
    ]
    return {
        "request_id": decision.request_id,
        "model": model_label,
        "learned": calibrated is not None,
        "request_blocks": len(request.block_hashes),
        "candidates": candidates,
    }
