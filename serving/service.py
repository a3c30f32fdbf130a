"""The scoring service: the state the HTTP API works on (router, directory, snapshots, decisions, log, metrics).

One :class:`ScoringService` per app. It wraps the embedded
:class:`~kvcost.routing.router.Router` (the same object the simulator embeds)
with what a live service needs:

* **routing** (:mod:`kvcost.serving.routing`): request bodies resolved into a
  ``RouteRequest`` and snapshots (the last load snapshot pushed per worker is
  used for candidates that carry none inline), scored and routed;
* **decisions** (:class:`~kvcost.serving.routing.DecisionStore`): every
  routed request's chosen worker and predicted terms, in an LRU of
  ``max_decisions`` entries keyed by request id, so that
  ``/v1/observe`` can join the actual times to the prediction; the full
  per-candidate rows (features and predictions) go to the DuckDB
  ``candidates`` table;
* **the log writer** (:class:`LogWriter`): the one thread that holds the
  DuckDB write connection (DuckDB admits one writer) and commits queued rows
  in groups;
* **the cost model** (:mod:`kvcost.serving.model_loading`): the MLflow champion when it loads, else the analytic
  model (and ``/readyz`` says degraded, and ``kvcost_model_fallbacks_total``
  counts it).

Durability of observations: ``/v1/observe`` returns only after the
observation's ``requests`` row is committed by DuckDB, whose commit syncs its
write-ahead log (``fdatasync``), so an acknowledged observation survives
``kill -9`` and power loss. Concurrent observations share one commit (group
commit). Decisions are queued without waiting (routing latency does not
include the disk); they are committed in groups within ``decision_linger_s``
(0.5 s; one insert costs about 6.5 ms of CPU whatever its rows: 6.8 ms per
decision inserted alone, 0.54 ms in groups of 12), and at the latest together
with their observation, which is queued
after them. A decision still queued when the process dies (``kill -9``) is
lost, and its observation is then recorded all the same, in
``unjoined_observations`` (answered ``unjoined``): no observation a client
sends after an acknowledged route is refused or lost. This was chosen over
answering ``/v1/route`` after the commit, which would put a group commit
(the linger, then an ``fdatasync``) into every routing decision's latency.

After a restart the service reloads the newest ``max_decisions`` chosen
candidates of earlier ``serve`` runs from the log, so a request routed before
the restart can still be observed (its ``arrival_s`` is then NULL, because
``candidates`` does not store it) and an observation already recorded is
still reported as a duplicate.

Clock: ``clock()`` returns wall-clock epoch seconds (the unit of vLLM's KV
event batch timestamps); it is injected, and nothing else reads the time.

Thread safety: the API calls the service from the event loop only. Code on
other threads that touches :attr:`ScoringService.directory` (a KV-event
ingestor) must hold :attr:`ScoringService.lock`, which routing and scoring
also hold.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime

from kvcost.core.hardware import StepTimeModel
from kvcost.core.types import Namespace, RouteDecision, RouteRequest, WorkerSnapshot
from kvcost.data.log_rows import (
    CandidateBatch,
    UnjoinedObservation,
    read_chosen_candidates,
    read_unjoined_ids,
    request_batch,
)
from kvcost.data.log_writer import LogUnavailableError, LogWriter
from kvcost.data.store import TERMS_AND_TTFT, LogStore
from kvcost.models.term_set import TermModelSet
from kvcost.routing.directory import CacheDirectory
from kvcost.routing.router import Router
from kvcost.serving.engines.kv_subscriber import KVEventSubscriber
from kvcost.serving.metrics import ServiceMetrics, StateSample
from kvcost.serving.model_loading import (
    ModelLoader,
    ModelManager,
    ModelStatus,
    RegistryLister,
    default_step_models,
    mlflow_champion_loader,
    mlflow_lister,
    one_line,
)
from kvcost.serving.outcomes import MeasuredOutcome, request_row
from kvcost.serving.routing import DecisionRecord, Routing
from kvcost.serving.schemas import (
    ModelsResponse,
    ModelStatusOut,
    ObservationIn,
    ObservationResponse,
    RouteResponse,
    ScoreRequestIn,
    ScoreResponse,
    SnapshotAck,
    SnapshotIn,
)
from kvcost.serving.settings import ServiceSettings
from kvcost.serving.unjoined import UnjoinedIds

_log = logging.getLogger(__name__)

#: ``runs.configuration`` of the service's runs.
SERVE_CONFIGURATION = "serve"


class ScoringService:
    """State and operations behind the HTTP API.

    Construction is pure; :meth:`start` loads the step-time profiles, opens the
    log, reloads recent decisions and starts the writer; :meth:`load_model`
    loads the champion; :meth:`stop` drains the writer and closes the log.

    Args:
        settings: service settings.
        clock: wall clock, epoch seconds.
        model_loader: loads the champion; default: from ``settings.mlflow_uri``
            (None when it is None: analytic by configuration).
        registry_lister: lists registry versions for ``GET /v1/cost-models``; default as ``model_loader``.
        step_models: step-time model per GPU type; default :func:`default_step_models`.
        roll: called on the writer thread every ``segment_roll_interval_s``; default:
            roll the log into Parquet segments next to the database (:mod:`kvcost.data.segments`).

    Thread safety: call from one event loop; see the module docstring for :attr:`lock`.
    """

    def __init__(
        self,
        settings: ServiceSettings,
        *,
        clock: Callable[[], float] = time.time,
        model_loader: ModelLoader | None | str = "settings",
        registry_lister: RegistryLister | None | str = "settings",
        step_models: Mapping[str, StepTimeModel] | None = None,
        roll: Callable[[LogStore], object] | None | str = "settings",
    ) -> None:
        self.settings = settings
        self.clock = clock
        uri = settings.mlflow_uri
        loader = (mlflow_champion_loader(uri) if uri else None) if model_loader == "settings" else model_loader
        lister = (mlflow_lister(uri) if uri else None) if registry_lister == "settings" else registry_lister
        self._roll_option = roll
        self._step_models_option = step_models
        self.metrics = ServiceMetrics()
        self.metrics.watch_state(self._state_sample)
        self.directory = CacheDirectory(settings.max_directory_blocks_per_worker)
        self.lock = threading.Lock()
        #: The KV-event subscriber feeding :attr:`directory` (set by the app), for its counters at scrape time.
        self.kv_subscriber: KVEventSubscriber | None = None
        self.run_id = settings.run_id or ""
        #: Routers, pushed snapshots and decisions; built by :meth:`start`.
        self.routing: Routing | None = None
        self._store: LogStore | None = None
        self._writer: LogWriter | None = None
        self._unjoined = UnjoinedIds(settings.max_decisions)
        self.models = ModelManager(
            loader,
            lister,
            apply=self._set_cost_model,
            metrics=self.metrics,
            clock=clock,
            timeout_s=settings.model_load_timeout_s,
            registry_uri=uri,
        )

    @property
    def model_status(self) -> ModelStatus:
        """The cost model in use and why."""
        return self.models.status

    @property
    def router(self) -> Router | None:
        """The routing router (None before :meth:`start`)."""
        return self.routing.router if self.routing is not None else None

    @property
    def step_models(self) -> dict[str, StepTimeModel]:
        """Step-time model per GPU type (empty before :meth:`start`)."""
        return self.routing.step_models if self.routing is not None else {}

    # ----------------------------------------------------------------- lifecycle

    @property
    def started(self) -> bool:
        """:meth:`start` has run and :meth:`stop` has not."""
        return self._writer is not None

    def start(self) -> None:
        """Load profiles, build the routers, open the log, record the run, reload decisions, start the writer.

        Raises:
            duckdb.Error: the log cannot be opened (e.g. another process holds it).
        """
        settings = self.settings
        step_models = self._step_models_option or default_step_models(
            settings.model, settings.tensor_parallel, settings.profile
        )
        if settings.gpu_default not in step_models:
            raise ValueError(f"gpu_default = {settings.gpu_default!r} has no step-time profile")
        self.routing = Routing(self.settings, self.directory, self.lock, step_models, self.clock)
        now_s = self.clock()
        self.run_id = self.settings.run_id or (
            f"serve-{datetime.fromtimestamp(now_s, UTC):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}"
        )
        store = LogStore(self.settings.db_path).open()
        try:
            self._recover(store)
            params = self.settings.model_dump(mode="json", exclude={"token_file"})
            params["token_required"] = self.settings.token_file is not None
            started = datetime.fromtimestamp(now_s, UTC).replace(tzinfo=None)
            store.write_run(self.run_id, SERVE_CONFIGURATION, "live", params, started)
        except BaseException:
            store.close()
            raise
        self._store = store
        roll = self._roll_callable(store)
        self._writer = LogWriter(
            store,
            self.metrics.log_write_errors.inc,
            max_queued=self.settings.max_queued_writes,
            roll=roll,
            roll_interval_s=self.settings.segment_roll_interval_s,
            linger_s=self.settings.decision_linger_s,
        )
        self._writer.start()
        self.models.publish_metrics()

    def stop(self) -> None:
        """Commit queued writes, roll the log a last time, close it (idempotent)."""
        if self._writer is not None:
            self._writer.stop()
            self._writer = None
        if self._store is not None:
            self._store.close()
            self._store = None

    def _roll_callable(self, store: LogStore) -> Callable[[], object] | None:
        if self._roll_option == "settings":
            if self.settings.segment_roll_interval_s <= 0:
                return None
            from kvcost.data.segments import roll_segments, segments_dir_for

            out = segments_dir_for(self.settings.db_path)
            return lambda: roll_segments(store, out)
        if self._roll_option is None:
            return None
        roll = self._roll_option
        return lambda: roll(store)

    def _recover(self, store: LogStore) -> None:
        """Reload the newest ``max_decisions`` chosen candidates of earlier serve runs (observed or not)."""
        rows = read_chosen_candidates(store, SERVE_CONFIGURATION, self.settings.max_decisions)
        # oldest first: the newest run wins a reused id and ends most recent
        self.routing.decisions.reload(
            (
                c.request_id,
                DecisionRecord(
                    c.run_id, c.worker_id, c.input_tokens, c.reusable_tokens, c.predicted_s, None, c.observed
                ),
            )
            for c in rows
        )
        if rows:
            _log.info("reloaded %d decisions of earlier serve runs from %s", len(rows), self.settings.db_path)
        for request_id in read_unjoined_ids(store, self.settings.max_decisions):
            self._unjoined.committed(request_id)

    # -------------------------------------------------------------------- models

    async def load_model(self) -> ModelStatus:
        """Load (or reload) the champion; see :meth:`ModelManager.load`."""
        return await self.models.load()

    def _set_cost_model(self, model_set: TermModelSet | None) -> None:
        if self.routing is not None:
            self.routing.set_cost_model(model_set)

    def model_status_out(self) -> ModelStatusOut:
        """The wire form of :attr:`model_status`."""
        return self.models.status_out()

    async def models_info(self) -> ModelsResponse:
        """The serving model and the registry's versions (a registry error is reported, not raised)."""
        return await self.models.models_info()

    def readiness(self) -> tuple[str, str]:
        """``(status, reason)``: ``ready`` / ``degraded`` (serving) or ``starting`` / ``unavailable`` (not serving)."""
        if self._writer is None:
            return "starting", "the service has not started"
        if not self._writer.alive:
            return "unavailable", f"the log writer stopped ({self._writer.last_error or 'no error recorded'})"
        status = self.model_status
        if status.status == "loading":
            return "starting", f"loading the champion from {self.settings.mlflow_uri}"
        if status.status == "degraded":
            return "degraded", status.reason
        if self._writer.last_error:
            return "degraded", f"the last log write failed ({self._writer.last_error}); observations may fail"
        return "ready", status.reason

    # ------------------------------------------------------------------- scoring

    def _require_started(self) -> None:
        if self.routing is None or self._writer is None:
            raise LogUnavailableError("the service has not started")

    def score(self, body: ScoreRequestIn) -> ScoreResponse:
        """Score every candidate; no routing side effects (see :meth:`Routing.score`).

        Raises:
            FieldError: a candidate without any snapshot, an unknown GPU type, more block hashes than tokens.
            LogUnavailableError: not started.
        """
        self._require_started()
        start = time.perf_counter()
        response = self.routing.score(body, self.model_status.label)
        self.metrics.route_latency.labels("score").observe(time.perf_counter() - start)
        self._count_doubts(response, "score")
        return response

    def route(self, body: ScoreRequestIn) -> RouteResponse:
        """Route the request, record the decision (memory + ``candidates``), return it with every breakdown.

        Raises:
            ConflictError: the request id was already routed (and is still remembered).
            FieldError: as :meth:`score`.
            LogUnavailableError: not started.
        """
        self._require_started()
        start = time.perf_counter()
        response, decision = self.routing.route(body, self.run_id, self.model_status.label)
        self._log_decision(decision, start)
        self._count_doubts(response, "route")
        return response

    def _count_doubts(self, response: ScoreResponse, endpoint: str) -> None:
        """Count an answer priced with another model's profile, or whose namespace no candidate declared."""
        if response.namespace_unverified:
            self.metrics.namespace_unverified.labels(endpoint).inc()
        if response.profile.startswith("fallback:"):
            self.metrics.profile_fallbacks.labels(endpoint).inc()

    def route_resolved(
        self,
        request: RouteRequest,
        snapshots: list[WorkerSnapshot],
        sources: Mapping[int, str],
        ages: Mapping[int, float],
        in_flight_ttl_s: float | None = None,
    ) -> tuple[RouteResponse, RouteDecision]:
        """Route a request the gateway resolved itself (token ids hashed, snapshots built); recorded as :meth:`route`.

        ``in_flight_ttl_s``: the gateway reports the outcome (:meth:`record_measured`) within this long, so
        the request's prefix counts as in flight until then (:meth:`Router.route`).

        Raises:
            FieldError: no candidate serves the request's namespace.
            LogUnavailableError: not started.
        """
        self._require_started()
        start = time.perf_counter()
        response, decision = self.routing.decide(
            request, snapshots, sources, ages, self.run_id, self.model_status.label, self.clock(), in_flight_ttl_s
        )
        self._log_decision(decision, start)
        return response, decision

    def _log_decision(self, decision: RouteDecision, start: float) -> None:
        try:
            self._writer.submit(CandidateBatch.of_decision(decision).batch(self.run_id))
        except LogUnavailableError as exc:  # the decision stands; only its features miss the log
            _log.warning("decision %d not logged: %s", decision.request_id, exc)
        self.metrics.count_decision(self.settings.policy, decision.reason)
        self.metrics.route_latency.labels("route").observe(time.perf_counter() - start)

    # --------------------------------------------------------------- observation

    async def observe(self, body: ObservationIn) -> ObservationResponse:
        """Record the actual times of a routed request in ``requests``; returns after the commit.

        Idempotent on the request id: a second observation (or one racing the
        first) returns ``duplicate`` and writes nothing. An id with no decision
        (routed just before a crash, whose decision was not committed yet; older
        than the last ``max_decisions``; or never routed) is recorded all the same
        in ``unjoined_observations`` and answered ``unjoined``: an observation is
        never refused for want of its decision.

        Raises:
            LogUnavailableError: the commit failed (nothing recorded; retry).
        """
        self._require_started()
        decision = self.routing.decisions.get(body.request_id)
        if decision is None:
            return await self._observe_unjoined(body)
        while decision.pending is not None:  # an observation of this id is in commit; DecisionRecord.settle clears it
            await asyncio.wait([decision.pending])
        if decision.observed:
            self.metrics.observations.labels("duplicate").inc()
            return ObservationResponse(
                request_id=body.request_id, status="duplicate", run_id=decision.run_id, worker_id=decision.worker_id
            )
        future = self._writer.submit(request_batch(decision.run_id, [request_row(body, decision)]), urgent=True)
        pending = asyncio.wrap_future(future)
        decision.pending = pending
        # registered first, so it runs before any waiter resumes (even if this handler is cancelled)
        pending.add_done_callback(decision.settle)
        try:
            await asyncio.shield(pending)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.metrics.observations.labels("failed").inc()
            raise LogUnavailableError(f"observation not recorded: {one_line(exc)}") from exc
        self.metrics.observations.labels("recorded").inc()
        self._count_errors(body, decision)
        finished = body.output_tokens if body.e2e_s is not None else None  # finished: its output length is known
        self.routing.on_outcome(body.request_id, body.ttft_s, self.routing.clock(), finished_output_tokens=finished)
        return ObservationResponse(
            request_id=body.request_id, status="recorded", run_id=decision.run_id, worker_id=decision.worker_id
        )

    async def _observe_unjoined(self, body: ObservationIn) -> ObservationResponse:
        """Record an observation without a decision in ``unjoined_observations`` (idempotent on its id)."""
        answer = ObservationResponse(request_id=body.request_id, status="unjoined", run_id=self.run_id, worker_id=None)
        while (pending := self._unjoined.state(body.request_id)) is not False:
            if pending is None:  # committed before
                self.metrics.observations.labels("duplicate").inc()
                return answer.model_copy(update={"status": "duplicate"})
            await asyncio.wait([pending])  # in commit; it settles the entry either way
        row = UnjoinedObservation(
            body.request_id,
            self.clock(),
            tuple(getattr(body, f"{term}_s") for term in TERMS_AND_TTFT),
            body.output_tokens,
            body.actual_reuse_tokens,
            body.tpot_s,
            body.e2e_s,
        )
        pending = asyncio.wrap_future(self._writer.submit(row.batch(self.run_id), urgent=True))
        self._unjoined.committing(body.request_id, pending)
        try:
            await asyncio.shield(pending)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._unjoined.failed(body.request_id)
            self.metrics.observations.labels("failed").inc()
            raise LogUnavailableError(f"observation not recorded: {one_line(exc)}") from exc
        self._unjoined.committed(body.request_id)
        self.metrics.observations.labels("unjoined").inc()
        return answer

    def _count_errors(self, body: ObservationIn | MeasuredOutcome, d: DecisionRecord) -> None:
        for term, predicted in zip(TERMS_AND_TTFT, d.predicted_s, strict=True):
            actual = getattr(body, f"{term}_s", None)
            if actual is not None:
                self.metrics.prediction_abs_error.labels(term).observe(abs(actual - predicted))

    def record_measured(self, measured: MeasuredOutcome) -> concurrent.futures.Future | None:
        """Record what the gateway measured of a request it routed (its ``requests`` row), without waiting.

        The row is queued and committed with the rows queued within ``decision_linger_s``
        (no one waits for it: the client has its answer already), so a crash loses at most
        that window of gateway rows; the returned future resolves when it is committed (None:
        the decision is unknown or already observed, nothing is written). A known TTFT
        reaches the router (:meth:`Routing.on_outcome`) at once, and so does an outcome without
        one (the request's prefix leaves the in-flight index).

        Raises:
            LogUnavailableError: not started, or the writer's queue is full.
        """
        self._require_started()
        decision = self.routing.decisions.get(measured.request_id)
        stored, now_s = measured.e2e_s is not None, self.routing.clock()
        if decision is None or decision.observed or decision.pending is not None:
            self.metrics.observations.labels("unknown" if decision is None else "duplicate").inc()
            if decision is None:  # forgotten (past max_decisions): its in-flight prefix must not stay
                self.routing.on_outcome(measured.request_id, None, now_s, stored)
            return None
        decision.observed = True  # the gateway is the only observer of its requests
        # the router learns first: a log that refuses the row (LogUnavailableError) loses only the row
        finished = measured.output_tokens if stored else None
        self.routing.on_outcome(measured.request_id, measured.ttft_s, now_s, stored, finished)
        row = request_row(measured, decision)
        future = self._writer.submit(request_batch(decision.run_id, [row]))
        self.metrics.observations.labels("recorded").inc()
        self._count_errors(measured, decision)
        return future

    # ----------------------------------------------------------------- snapshots

    def push_snapshot(self, worker_id: int, body: SnapshotIn) -> SnapshotAck:
        """Store a worker's snapshot (replacing its previous one); see :meth:`Routing.push_snapshot`.

        Raises:
            FieldError: unknown GPU type. ConflictError: ``max_workers`` other workers already tracked.
        """
        self._require_started()
        return self.routing.push_snapshot(worker_id, body)

    # ------------------------------------------------------------------- metrics

    def _state_sample(self) -> StateSample:
        if not self.started:
            return StateSample()
        now_s = self.clock()
        subscriber = self.kv_subscriber
        with self.lock:
            kv_stats = {}
            unknown_topic = 0
            if subscriber is not None:
                kv_stats = {w: replace(st) for w, st in subscriber.ingestor.worker_stats.items()}
                unknown_topic = subscriber.unknown_topic_messages
            pushed = dict(self.routing.snapshots)
            workers = sorted(set(pushed) | set(kv_stats))
            blocks = self.directory.num_blocks()
            matches = self.directory.match(Namespace(""), (), workers, now_s)
            stale = {w: self.directory.is_stale(w) for w in workers}
            held = {w: self.directory.blocks_held(w) for w in workers}
            capped = {w: self.directory.capped_blocks.get(w, 0) for w in workers}
            in_flight = self.routing.router.in_flight
        return StateSample(
            directory_blocks=blocks,
            directory_staleness_s={m.worker_id: m.age_s for m in matches},
            directory_stale=stale,
            directory_mode={w: self.routing.directory_mode(w) for w in workers},
            directory_blocks_held=held,
            directory_capped_blocks=capped,
            in_flight_capped_entries=in_flight.capped_entries if in_flight is not None else 0,
            snapshot_age_s={w: max(0.0, now_s - received_s) for w, (_, received_s) in sorted(pushed.items())},
            decisions_in_memory=len(self.routing.decisions),
            kv_event_stats=kv_stats,
            kv_event_unknown_topic_messages=unknown_topic,
        )

    def decisions_in_memory(self) -> int:
        """Decisions held for ``/v1/observe``."""
        return len(self.routing.decisions) if self.routing is not None else 0
