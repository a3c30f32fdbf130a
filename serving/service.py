"""The scoring service: the state the HTTP API works on (router, directory, snapshots, decisions, log, metrics).

One :class:`ScoringService` per app. It wraps the embedded
:class:`~kvcost.routing.router.Router` (the same object the simulator embeds)
with what a live service needs:

* **snapshots**: the last load snapshot pushed per worker, used for candidates
  that carry none inline;
* **decisions**: every routed request's chosen worker and predicted terms, in
  an LRU of ``max_decisions`` entries keyed by request id, so that
  ``/v1/observe`` can join the actual times to the prediction; the full
  per-candidate rows (features and predictions) go to the DuckDB
  ``candidates`` table;
* **the log writer** (:class:`LogWriter`): the one thread that holds the
  DuckDB write connection (DuckDB admits one writer) and commits queued rows
  in groups;
* **the cost model**: the MLflow champion when it loads, else the analytic
  model (and ``/readyz`` says degraded, and ``kvcost_model_fallbacks_total``
  counts it).

Durability of observations: ``/v1/observe`` returns only after the
observation's ``requests`` row is committed by DuckDB, whose commit syncs its
write-ahead log (``fdatasync``), so an acknowledged observation survives
``kill -9`` and power loss. Concurrent observations share one commit (group
commit). Decisions are queued without waiting (routing latency does not
include the disk); they are committed in groups within ``decision_linger_s``
(50 ms), and at the latest together with their observation, which is queued
after them.

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
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import numpy as np

from kvcost.core.composition import TERMS
from kvcost.core.hardware import GPUS, StepTimeModel
from kvcost.core.types import Namespace, RouteDecision, RouteRequest, WorkerSnapshot
from kvcost.data.log_writer import LogUnavailableError, LogWriter
from kvcost.data.store import LogStore
from kvcost.features.spec import FEATURE_INDEX, FEATURE_SPEC, feature_spec_hash
from kvcost.models.term_set import TermModelSet
from kvcost.routing.block_hash import DEFAULT_HASH_ALGORITHM, BlockHasher, PrefixHashCache
from kvcost.routing.compatibility import serves
from kvcost.routing.directory import CacheDirectory
from kvcost.routing.router import Router, RouterSettings
from kvcost.serving.engines.kv_subscriber import KVEventSubscriber
from kvcost.serving.errors import ConflictError, FieldError, UnknownRequestError
from kvcost.serving.metrics import ServiceMetrics, StateSample
from kvcost.serving.schemas import (
    CandidateScore,
    ModelsResponse,
    ModelStatusOut,
    NamespaceIn,
    ObservationIn,
    ObservationResponse,
    RouteResponse,
    ScoreRequestIn,
    ScoreResponse,
    SnapshotAck,
    SnapshotIn,
    TermsOut,
)
from kvcost.serving.settings import ServiceSettings

_log = logging.getLogger(__name__)

#: ``runs.configuration`` of the service's runs.
SERVE_CONFIGURATION = "serve"
#: Predicted / actual columns in ``requests`` order: the five terms, then TTFT.
_TERMS_AND_TTFT = (*TERMS, "ttft")

ModelLoader = Callable[[], tuple[TermModelSet, str | None]]
"""Loads the champion: returns the model set and its registry version (None if unknown). Runs in a thread."""
RegistryLister = Callable[[], list[dict]]
"""Lists the registry's versions (rows of :func:`kvcost.models.mlflow_store.list_versions`). Runs in a thread."""


def block_hashes_for(
    token_ids: Sequence[int],
    block_size_tokens: int,
    namespace: Namespace,
    algorithm: str = DEFAULT_HASH_ALGORITHM,
    hash_seed: str = "0",
    cache: PrefixHashCache | None = None,
) -> tuple[int, ...]:
    """The block hashes a vLLM engine publishes for ``token_ids`` sent in ``namespace``; the service's token hasher.

    vLLM's chaining (:mod:`kvcost.routing.block_hash`): the namespace's adapter
    is the LoRA name vLLM puts in every block's extra keys, its cache salt goes
    in the first block's; ``algorithm`` and ``hash_seed`` are the engines'
    ``--prefix-caching-hash-algo`` and ``PYTHONHASHSEED``. Model, revision and
    KV layout are not hashed (vLLM does not): the directory keeps namespaces
    apart. Only full blocks are hashed (a partial last block is not cacheable).

    Args:
        token_ids: prompt token ids, each in ``[0, 2**32)``.
        block_size_tokens: tokens per block (≥ 1).
        namespace: the request's KV namespace.
        algorithm: one of :data:`kvcost.routing.block_hash.HASH_ALGORITHMS`.
        hash_seed: the engines' ``PYTHONHASHSEED`` string.
        cache: digests of blocks already hashed (shared prefixes are hashed once); None = none.

    Returns:
        ``len(token_ids) // block_size_tokens`` hashes in prompt order, each in ``[0, 2**64)``.

    Raises:
        ValueError: ``block_size_tokens`` < 1, or an unknown ``algorithm``.
    """
    extra_keys = (namespace.adapter,) if namespace.adapter else ()
    hasher = BlockHasher(block_size_tokens, hash_seed, algorithm, cache)
    return tuple(hasher.hashes(token_ids, extra_keys, namespace.cache_salt or None))


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


@dataclass(frozen=True, slots=True)
class ModelStatus:
    """The cost model in use and why (see :class:`kvcost.serving.schemas.ModelStatusOut`)."""

    kind: str
    source: str
    version: str | None
    status: str
    reason: str
    loaded_at_s: float | None = None
    metadata: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        """``analytic``, ``champion`` or ``champion vN``."""
        if self.source != "champion":
            return "analytic"
        return f"champion v{self.version}" if self.version else "champion"


def default_step_models(model: str) -> dict[str, StepTimeModel]:
    """Step-time model of ``model`` on every GPU type with a bundled (or derivable) profile."""
    models = {}
    for gpu in GPUS.names():
        try:
            models[gpu] = StepTimeModel.for_hardware(model, gpu)
        except KeyError:
            _log.info("no profile of %s on %s: snapshots naming it are refused", model, gpu)
    return models


def mlflow_champion_loader(uri: str) -> ModelLoader:
    """Loads the ``champion`` of ``kvcost-terms`` at ``uri`` and looks up its version number."""

    def load() -> tuple[TermModelSet, str | None]:
        from kvcost.models.mlflow_store import CHAMPION, list_versions, load_model_set

        model_set = load_model_set(uri, CHAMPION)
        version = next((row["version"] for row in list_versions(uri) if CHAMPION in row["aliases"]), None)
        return model_set, version

    return load


def mlflow_lister(uri: str) -> RegistryLister:
    """Lists the ``kvcost-terms`` versions at ``uri``."""

    def lister() -> list[dict]:
        from kvcost.models.mlflow_store import list_versions

        return list_versions(uri)

    return lister


def _finite_or_none(value: float) -> float | None:
    value = float(value)
    return value if np.isfinite(value) else None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


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
        registry_lister: lists registry versions for ``GET /v1/models``; default as ``model_loader``.
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
        self._loader = (mlflow_champion_loader(uri) if uri else None) if model_loader == "settings" else model_loader
        self._lister = (mlflow_lister(uri) if uri else None) if registry_lister == "settings" else registry_lister
        self._roll_option = roll
        self._step_models_option = step_models
        self.metrics = ServiceMetrics()
        self.metrics.watch_state(self._state_sample)
        self.directory = CacheDirectory()
        self.lock = threading.Lock()
        self._hash_cache = PrefixHashCache(settings.hash_cache_blocks) if settings.hash_cache_blocks else None
        #: The KV-event subscriber feeding :attr:`directory` (set by the app), for its counters at scrape time.
        self.kv_subscriber: KVEventSubscriber | None = None
        self.run_id = settings.run_id or ""
        self.step_models: dict[str, StepTimeModel] = {}
        self.router: Router | None = None
        self._scorer: Router | None = None
        self._snapshots: dict[int, tuple[WorkerSnapshot, float]] = {}
        self._decisions: OrderedDict[int, DecisionRecord] = OrderedDict()
        self._store: LogStore | None = None
        self._writer: LogWriter | None = None
        self._reload_lock = asyncio.Lock()
        if self._loader is None:
            self.model_status = ModelStatus(
                "analytic", "analytic", None, "ready", "no model registry configured: the analytic model by choice"
            )
        else:
            self.model_status = ModelStatus("analytic", "analytic", None, "loading", "loading the champion")

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
        self.step_models = dict(self._step_models_option or default_step_models(self.settings.model))
        if self.settings.gpu_default not in self.step_models:
            raise ValueError(f"gpu_default = {self.settings.gpu_default!r} has no step-time profile")
        # analytic until the champion loads; the service reports any fallback itself (log, metric, /readyz)
        analytic = TermModelSet.analytic()
        routing = RouterSettings(policy=self.settings.policy, tiers=self.settings.tiers)
        self.router = Router(self.directory, self.step_models, routing, analytic)
        # Scores come from a second router over the same directory and cost model with the
        # stateless cost_aware policy: /v1/score never touches the routing router's skew
        # window or policy state, and shares every line of its scoring code.
        scoring = RouterSettings(policy="cost_aware", tiers=self.settings.tiers)
        self._scorer = Router(self.directory, self.step_models, scoring, analytic)
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
        self._publish_model_metrics()

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
        pred_cols = ", ".join(f"c.pred_{t}_s" for t in _TERMS_AND_TTFT)
        rows = store.connection.execute(
            f"""
            SELECT c.run_id, c.request_id, c.worker_id, c.input_tokens, c.reusable_tokens, {pred_cols},
                   q.request_id IS NOT NULL AS observed
            FROM candidates c
            JOIN runs r ON r.run_id = c.run_id AND r.configuration = ?
            LEFT JOIN (SELECT DISTINCT run_id, request_id FROM requests) q
                   ON q.run_id = c.run_id AND q.request_id = c.request_id
            WHERE c.chosen
            ORDER BY r.started_at DESC, c.rowid DESC
            LIMIT ?
            """,
            [SERVE_CONFIGURATION, self.settings.max_decisions],
        ).fetchall()
        for row in reversed(rows):  # oldest first: the newest run wins a reused id and ends most recent
            run_id, request_id, worker_id, input_tokens, reuse, *pred, observed = row
            self._decisions.pop(request_id, None)
            self._decisions[request_id] = DecisionRecord(
                run_id, worker_id, input_tokens, reuse, tuple(pred), None, observed=bool(observed)
            )
        if rows:
            _log.info("reloaded %d decisions of earlier serve runs from %s", len(rows), self.settings.db_path)

    # -------------------------------------------------------------------- models

    async def load_model(self) -> ModelStatus:
        """Load (or reload) the champion; on failure keep scoring (analytic fallback, or the champion already loaded).

        A failure while no champion is loaded falls back to the analytic model,
        marks the service degraded and counts ``kvcost_model_fallbacks_total``.
        A failed *reload* keeps the champion already in use (degraded: the
        registry is unreachable) rather than replacing it by the analytic model.
        """
        if self._loader is None:
            return self.model_status
        async with self._reload_lock:
            try:
                model_set, version = await asyncio.wait_for(
                    asyncio.to_thread(self._loader), self.settings.model_load_timeout_s
                )
            except Exception as exc:  # the registry's errors are many; every one means "not loaded"
                if isinstance(exc, TimeoutError):
                    reason, kind = f"timed out after {self.settings.model_load_timeout_s:g} s", "timeout"
                else:
                    reason, kind = _one_line(exc), "load_failed"
                current = self.model_status
                if current.source == "champion":
                    why = f"reload failed ({reason}); still serving {current.label}"
                    self.model_status = replace(current, status="degraded", reason=why)
                else:
                    self._set_cost_model(TermModelSet.analytic())
                    self.metrics.model_fallbacks.labels(kind).inc()
                    why = f"champion not loaded ({reason}); scoring with the analytic model"
                    self.model_status = ModelStatus("analytic", "analytic", None, "degraded", why, self.clock())
                _log.warning("%s", why)
            else:
                self._set_cost_model(model_set)
                kind = "learned" if model_set.learned else "analytic"
                label = f"champion v{version}" if version else "champion"
                self.model_status = ModelStatus(
                    kind, "champion", version, "ready", f"{label} loaded", self.clock(), dict(model_set.metadata)
                )
            self._publish_model_metrics()
            return self.model_status

    def _set_cost_model(self, model_set: TermModelSet | None) -> None:
        with self.lock:
            for router in (self.router, self._scorer):
                if router is not None:
                    router.set_cost_model(model_set)

    def _publish_model_metrics(self) -> None:
        self.metrics.model_degraded.set(1 if self.model_status.status == "degraded" else 0)
        self.metrics.model_learned.set(1 if self.model_status.kind == "learned" else 0)

    def model_status_out(self) -> ModelStatusOut:
        """The wire form of :attr:`model_status`."""
        s = self.model_status
        return ModelStatusOut(
            kind=s.kind,
            source=s.source,
            version=s.version,
            status=s.status,
            reason=s.reason,
            loaded_at_s=s.loaded_at_s,
            feature_spec_hash=s.metadata.get("feature_spec_hash", feature_spec_hash()),
            metadata=_json_safe(s.metadata),
        )

    async def models_info(self) -> ModelsResponse:
        """The serving model and the registry's versions (a registry error is reported, not raised)."""
        versions: list[dict] = []
        error = None
        if self._lister is not None:
            try:
                versions = await asyncio.wait_for(asyncio.to_thread(self._lister), self.settings.model_load_timeout_s)
            except Exception as exc:
                error = _one_line(exc) if not isinstance(exc, TimeoutError) else "registry listing timed out"
        return ModelsResponse(
            serving=self.model_status_out(),
            feature_spec_hash=feature_spec_hash(),
            registry_uri=self.settings.mlflow_uri,
            registry_error=error,
            versions=[_json_safe(v) for v in versions],
        )

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

    def _resolve(self, body: ScoreRequestIn, now_s: float) -> tuple[RouteRequest, list[WorkerSnapshot], list, list]:
        req = body.request
        block_size = req.namespace.block_size_tokens or self.settings.block_size_tokens
        ns = Namespace(
            model=req.namespace.model,
            revision=req.namespace.revision,
            adapter=req.namespace.adapter,
            block_size_tokens=block_size,
            kv_layout=req.namespace.kv_layout,
            # not cache_salt: vLLM hashes the salt into the first block, and its KV events do not
            # carry it, so salted blocks are stored (and found) in the unsalted namespace
        )
        if req.token_ids is not None:
            salted = replace(ns, cache_salt=req.namespace.cache_salt)
            hashes = block_hashes_for(
                req.token_ids,
                block_size,
                salted,
                self.settings.hash_algorithm,
                self.settings.hash_seed,
                self._hash_cache,
            )
            input_tokens = len(req.token_ids)
        else:
            hashes = tuple(req.block_hashes or ())
            input_tokens = int(req.input_tokens or 0)
            if len(hashes) > input_tokens // block_size:
                raise FieldError(
                    ("request", "block_hashes"),
                    f"{len(hashes)} full blocks of {block_size} tokens exceed input_tokens = {input_tokens}",
                )
        snapshots, sources, ages = [], [], []
        for i, candidate in enumerate(body.candidates):
            if candidate.snapshot is not None:
                snapshot = self._snapshot(candidate.worker_id, candidate.snapshot, ("candidates", i, "snapshot"))
                sources.append("inline")
                ages.append(0.0)
            else:
                stored = self._snapshots.get(candidate.worker_id)
                if stored is None:
                    raise FieldError(
                        ("candidates", i, "snapshot"),
                        f"worker {candidate.worker_id} has no snapshot: send one inline or "
                        f"POST /v1/workers/{candidate.worker_id}/snapshot first",
                    )
                snapshot, received_s = stored
                sources.append("pushed")
                ages.append(max(0.0, now_s - received_s))
            snapshots.append(snapshot)
        serving = [i for i, snapshot in enumerate(snapshots) if serves(snapshot.namespace, ns)]
        if not serving:
            raise FieldError(
                ("candidates",),
                f"no candidate serves namespace model={ns.model!r} revision={ns.revision!r} "
                f"adapter={ns.adapter!r} block_size_tokens={ns.block_size_tokens}",
            )
        if len(serving) < len(snapshots):
            snapshots, sources, ages = ([x[i] for i in serving] for x in (snapshots, sources, ages))
        arrival_s = req.arrival_s if req.arrival_s is not None else now_s
        return RouteRequest(req.request_id, arrival_s, input_tokens, hashes, ns), snapshots, sources, ages

    def _snapshot(self, worker_id: int, body: SnapshotIn, loc: tuple[str | int, ...]) -> WorkerSnapshot:
        gpu = body.gpu or self.settings.gpu_default
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
        )

    def _worker_namespace(self, body: NamespaceIn | None) -> Namespace | None:
        if body is None:
            return None
        block_size = body.block_size_tokens or self.settings.block_size_tokens
        return Namespace(body.model, body.revision, body.adapter, block_size, body.kv_layout)

    def _require_started(self) -> None:
        if self.router is None or self._scorer is None or self._writer is None:
            raise LogUnavailableError("the service has not started")

    def score(self, body: ScoreRequestIn) -> ScoreResponse:
        """Score every candidate; no routing side effects (the routing router is not touched).

        Raises:
            FieldError: a candidate without any snapshot, an unknown GPU type, more block hashes than tokens.
        """
        self._require_started()
        start = time.perf_counter()
        now_s = self.clock()
        request, snapshots, sources, ages = self._resolve(body, now_s)
        with self.lock:
            decision = self._scorer.route(request, snapshots, now_s)
        response = ScoreResponse(**self._score_fields(decision, sources, ages))
        self.metrics.route_latency.labels("score").observe(time.perf_counter() - start)
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
        request_id = body.request.request_id
        known = self._decisions.get(request_id)
        if known is not None:
            raise ConflictError(
                f"request_id {request_id} was already routed (to worker {known.worker_id}, run {known.run_id}); "
                "request ids must be unique"
            )
        now_s = self.clock()
        request, snapshots, sources, ages = self._resolve(body, now_s)
        with self.lock:
            decision = self.router.route(request, snapshots, now_s)
        index = decision.chosen_index
        pred = decision.predictions.as_matrix()
        self._decisions[request_id] = DecisionRecord(
            self.run_id,
            decision.worker_id,
            request.input_tokens,
            int(decision.reusable_tokens[index]),
            tuple(float(x) for x in pred[index]),
            request.arrival_s,
        )
        while len(self._decisions) > self.settings.max_decisions:
            self._decisions.popitem(last=False)
        try:
            self._writer.submit("candidates", self._candidate_columns(decision, pred))
        except LogUnavailableError as exc:  # the decision stands; only its features miss the log
            _log.warning("decision %d not logged: %s", request_id, exc)
        response = RouteResponse(
            **self._score_fields(decision, sources, ages),
            worker_id=decision.worker_id,
            chosen_index=index,
            policy=self.settings.policy,
            reason=decision.reason,
            run_id=self.run_id,
        )
        self.metrics.count_decision(self.settings.policy, decision.reason)
        self.metrics.route_latency.labels("route").observe(time.perf_counter() - start)
        return response

    def _score_fields(self, decision: RouteDecision, sources: list, ages: list) -> dict:
        p = decision.predictions
        ttft = p.ttft_s
        calibrated = decision.calibrated
        p50 = calibrated.p50_s if calibrated is not None else ttft
        p90 = calibrated.p90_s if calibrated is not None else np.full_like(ttft, np.nan)
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
                score_s=float(p50[i]),
                reusable_tokens=int(decision.reusable_tokens[i]),
                reusable_blocks=decision.matches[i].reusable_blocks,
                tier=decision.matches[i].tier,
                directory_age_s=_finite_or_none(decision.matches[i].age_s),
                directory_stale=decision.matches[i].stale,
                snapshot=sources[i],
                snapshot_age_s=ages[i],
            )
            for i, worker_id in enumerate(decision.worker_ids)
        ]
        return {
            "request_id": decision.request_id,
            "model": self.model_status.label,
            "learned": calibrated is not None,
            "request_blocks": int(decision.features[0, FEATURE_INDEX["request_blocks"]]),
            "candidates": candidates,
        }

    def _candidate_columns(self, decision: RouteDecision, pred: np.ndarray) -> dict[str, Any]:
        n = len(decision.worker_ids)
        columns: dict[str, Any] = {
            "run_id": [self.run_id] * n,
            "request_id": np.full(n, decision.request_id, dtype=np.int64),
            "worker_id": np.asarray(decision.worker_ids, dtype=np.int64),
            "chosen": np.arange(n) == decision.chosen_index,
        }
        for j, feature in enumerate(FEATURE_SPEC):
            values = decision.features[:, j]
            columns[feature.name] = np.rint(values).astype(np.int64) if feature.dtype == "BIGINT" else values
        for j, term in enumerate(_TERMS_AND_TTFT):
            columns[f"pred_{term}_s"] = np.ascontiguousarray(pred[:, j])
        return columns

    # --------------------------------------------------------------- observation

    async def observe(self, body: ObservationIn) -> ObservationResponse:
        """Record the actual times of a routed request in ``requests``; returns after the commit.

        Idempotent on the request id: a second observation (or one racing the
        first) returns ``duplicate`` and writes nothing.

        Raises:
            UnknownRequestError: no remembered decision for the id.
            LogUnavailableError: the commit failed (nothing recorded; retry).
        """
        self._require_started()
        decision = self._decisions.get(body.request_id)
        if decision is None:
            self.metrics.observations.labels("unknown").inc()
            raise UnknownRequestError(
                f"request_id {body.request_id} is unknown: never routed by this service's log, "
                f"or older than the last {self.settings.max_decisions} decisions"
            )
        while decision.pending is not None:  # an observation of this id is being committed; _settle clears it
            await asyncio.wait([decision.pending])
        if decision.observed:
            self.metrics.observations.labels("duplicate").inc()
            return ObservationResponse(
                request_id=body.request_id, status="duplicate", run_id=decision.run_id, worker_id=decision.worker_id
            )
        future = self._writer.submit("requests", self._request_columns(body, decision), urgent=True)
        pending = asyncio.wrap_future(future)
        decision.pending = pending
        # registered first, so it runs before any waiter resumes (even if this handler is cancelled)
        pending.add_done_callback(lambda f: _settle(decision, f))
        try:
            await asyncio.shield(pending)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.metrics.observations.labels("failed").inc()
            raise LogUnavailableError(f"observation not recorded: {_one_line(exc)}") from exc
        self.metrics.observations.labels("recorded").inc()
        self._count_errors(body, decision)
        return ObservationResponse(
            request_id=body.request_id, status="recorded", run_id=decision.run_id, worker_id=decision.worker_id
        )

    def _request_columns(self, body: ObservationIn, d: DecisionRecord) -> dict[str, list]:
        actual_reuse = body.actual_reuse_tokens
        mismatch = None if actual_reuse is None else max(0, d.predicted_reuse_tokens - actual_reuse)
        columns: dict[str, list] = {
            "run_id": [d.run_id],
            "request_id": [body.request_id],
            "arrival_s": [d.arrival_s],
            "worker_id": [d.worker_id],
            "input_tokens": [d.input_tokens],
            "output_tokens": [body.output_tokens],
            "predicted_reuse_tokens": [d.predicted_reuse_tokens],
            "actual_reuse_tokens": [actual_reuse],
            "tpot_s": [body.tpot_s],
            "e2e_s": [body.e2e_s],
            "directory_mismatch_tokens": [mismatch],
            # engines do not report where a prefix came from nor what a miss cost: NULL
            "mismatch_lost_s": [None],
            "served_by": [None],
        }
        for term, predicted in zip(_TERMS_AND_TTFT, d.predicted_s, strict=True):
            columns[f"pred_{term}_s"] = [predicted]
            columns[f"actual_{term}_s"] = [getattr(body, f"{term}_s")]
        return columns

    def _count_errors(self, body: ObservationIn, d: DecisionRecord) -> None:
        for term, predicted in zip(_TERMS_AND_TTFT, d.predicted_s, strict=True):
            actual = getattr(body, f"{term}_s")
            if actual is not None:
                self.metrics.prediction_abs_error.labels(term).observe(abs(actual - predicted))

    # ----------------------------------------------------------------- snapshots

    def push_snapshot(self, worker_id: int, body: SnapshotIn) -> SnapshotAck:
        """Store a worker's snapshot (replacing its previous one).

        Raises:
            FieldError: unknown GPU type. ConflictError: ``max_workers`` other workers already tracked.
        """
        self._require_started()
        snapshot = self._snapshot(worker_id, body, ())
        if worker_id not in self._snapshots and len(self._snapshots) >= self.settings.max_workers:
            raise ConflictError(f"{len(self._snapshots)} workers already tracked (max_workers); worker {worker_id}")
        now_s = self.clock()
        self._snapshots[worker_id] = (snapshot, now_s)
        return SnapshotAck(worker_id=worker_id, received_at_s=now_s)

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
            workers = sorted(set(self._snapshots) | set(kv_stats))
            blocks = self.directory.num_blocks()
            matches = self.directory.match(Namespace(""), (), workers, now_s)
            stale = {w: self.directory.is_stale(w) for w in workers}
        return StateSample(
            directory_blocks=blocks,
            directory_staleness_s={m.worker_id: m.age_s for m in matches},
            directory_stale=stale,
            snapshot_age_s={w: max(0.0, now_s - received_s) for w, (_, received_s) in sorted(self._snapshots.items())},
            decisions_in_memory=len(self._decisions),
            kv_event_stats=kv_stats,
            kv_event_unknown_topic_messages=unknown_topic,
        )

    def decisions_in_memory(self) -> int:
        """Decisions held for ``/v1/observe``."""
        return len(self._decisions)


def _settle(decision: DecisionRecord, future: asyncio.Future) -> None:
    decision.pending = None
    if not future.cancelled() and future.exception() is None:
        decision.observed = True


def _json_safe(value: Any) -> Any:
    """``value`` with non-finite floats replaced by None (JSON has no NaN), recursively."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, float | np.floating):
        return _finite_or_none(value)
    if isinstance(value, np.integer):
        return int(value)
    return value
