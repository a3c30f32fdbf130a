"""The scoring API (FastAPI): :func:`create_app` builds one app around one :class:`ScoringService`.

=========================================  =====  ==================================================
route                                      token  does
=========================================  =====  ==================================================
``POST /v1/score``                                per-candidate terms, TTFT, P50/P90, reuse, score
``POST /v1/route``                         yes    like score, plus the chosen worker; recorded
``POST /v1/observe``                       yes    actual times by request id → ``requests``
``POST /v1/workers/{worker_id}/snapshot``  yes    a worker's load snapshot
``POST /v1/evict/rank``                           idle prefix nodes in eviction order, with value terms
``GET /v1/cost-models``                           serving cost model, registry versions, spec hash
``POST /v1/cost-models/reload``            yes    load the champion again
``GET /healthz``                                  liveness
``GET /readyz``                                   200 ready / degraded; 503 starting / unavailable
``GET /metrics``                                  Prometheus text format
=========================================  =====  ==================================================

With engines (``kvcost serve --engine W=URL …``) the app is also an
OpenAI-compatible gateway: ``POST /v1/completions``, ``POST
/v1/chat/completions`` and ``GET /v1/models`` (OpenAI's model list), in
:mod:`kvcost.serving.gateway.routes`. The cost-model registry view that
``/v1/models`` served before the gateway is ``/v1/cost-models``.

"token: yes" endpoints need ``Authorization: Bearer <token>`` when the
settings name a token file (compared in constant time); 401 otherwise.
Errors: 422 with ``detail[].loc`` naming the field (and a one-line
``message``), 413 for a body over ``max_body_bytes`` (by ``Content-Length``
or as streamed), 409 for a request id routed
twice, 503 when the log cannot commit an observation.

``/readyz`` answers 200 ``degraded`` (not 503) when the champion could not be
loaded: scoring continues on the analytic model, and a 503 would make a load
balancer drop every replica exactly when the registry is down, which the
fallback exists to survive. The body says why; ``kvcost_model_degraded`` is 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import re
from collections.abc import AsyncIterator, Iterable
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, BeforeValidator
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvcost.models.reuse import load_reuse_model
from kvcost.serving.engines.kv_events import KVEventIngestor
from kvcost.serving.engines.kv_subscriber import KVEventSubscriber
from kvcost.serving.engines.liveness import EngineLiveness
from kvcost.serving.error_bodies import ModelT, field_error_body, parse_json_body, validation_error_body
from kvcost.serving.errors import ConflictError, FieldError, LogUnavailableError
from kvcost.serving.gateway.engine_http import engine_client
from kvcost.serving.gateway.routes import build_gateway, openai, openai_error_response
from kvcost.serving.gateway.sse import OpenAIError
from kvcost.serving.heavy import HeavyPool, PoolBusyError
from kvcost.serving.metrics import watch_loop_lag
from kvcost.serving.schemas import (
    MAX_ID,
    ErrorOut,
    EvictRankIn,
    EvictRankResponse,
    HealthResponse,
    ModelsResponse,
    ModelStatusOut,
    ObservationIn,
    ObservationResponse,
    ReadinessResponse,
    RouteResponse,
    ScoreRequestIn,
    ScoreResponse,
    SnapshotAck,
    SnapshotIn,
)
from kvcost.serving.scraping import engine_scraper
from kvcost.serving.service import ScoringService
from kvcost.serving.settings import ServiceSettings, parse_kv_event_source, read_token

API_VERSION = "1"


class BodySizeLimitMiddleware:
    """Refuse request bodies over ``max_body_bytes`` with 413: by ``Content-Length`` up front, else as streamed.

    ``path_limits`` raises (or lowers) the limit of single paths: a 100,000-node
    ``/v1/evict/rank`` body is about 17–35 MiB, parsed in a worker process.
    A chunked body is counted as it is received; the first chunk past the
    limit raises a 413 ``HTTPException`` inside the route's body read, which
    FastAPI passes through to its exception handler. Pure ASGI (no buffering).
    """

    def __init__(self, app: ASGIApp, max_body_bytes: int, path_limits: dict[str, int] | None = None) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.path_limits = dict(path_limits or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.path_limits.get(scope["path"], self.max_body_bytes)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                await _plain(send, 400, "invalid Content-Length header")
                return
            if length > limit:
                await _plain(send, 413, _too_large(limit))
                return
        received = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise HTTPException(413, _too_large(limit))
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except HTTPException as exc:  # raised outside a route's body read
            if exc.status_code != 413 or started:
                raise
            await _plain(send, 413, _too_large(limit))


def _too_large(limit: int) -> str:
    return f"request body larger than {limit} bytes"


async def _plain(send: Send, status: int, detail: str) -> None:
    body = JSONResponse({"detail": detail}).body
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# --------------------------------------------------------------------- dependencies


# dependencies are async: FastAPI would run a plain function in a worker thread, a hop per request


async def get_service(request: Request) -> ScoringService:
    """The app's service."""
    return request.app.state.service


ServiceDep = Annotated[ScoringService, Depends(get_service)]
_bearer = HTTPBearer(auto_error=False, description="the token in --token-file (write endpoints)")


async def require_token(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """401 unless the bearer token matches the configured one (constant-time); no-op without a token file."""
    expected: str | None = request.app.state.token
    if expected is None:
        return
    given = credentials.credentials if credentials is not None else ""
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})


async def require_read_token(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """:func:`require_token` on a read endpoint, only when the service runs with ``--protect-reads``."""
    if request.app.state.protect_reads:
        await require_token(request, credentials)


WriteAuth = [Depends(require_token)]
ReadAuth = [Depends(require_read_token)]
_ERRORS = {
    401: {"model": ErrorOut, "description": "missing or wrong bearer token"},
    408: {"model": ErrorOut, "description": "the request head or body did not arrive in time (--head-timeout-s, …)"},
    413: {"model": ErrorOut, "description": "body too large"},
    422: {"model": ErrorOut, "description": "invalid input; detail[].loc names the field"},
    503: {
        "model": ErrorOut,
        "description": "too many open connections or requests (--limit-concurrency); retry after Retry-After",
        "headers": {"Retry-After": {"description": "seconds", "schema": {"type": "integer"}}},
    },
}
_BUSY = {
    **_ERRORS[503],
    "description": "too many open connections or requests, the worker pool's queue is full, or a worker died; "
    "retry after the Retry-After header's seconds",
}
_CONFLICT = {"model": ErrorOut, "description": "the request id was routed before"}
_UNCOMMITTED = {
    "model": ErrorOut,
    "description": "the log could not commit the observation (nothing recorded), or too many open connections "
    "or requests (then with Retry-After)",
}


def _json_body_of(model: type[BaseModel]) -> dict:
    """The OpenAPI ``requestBody`` of an endpoint that reads its body itself (its schema is added to the
    components by :func:`_openapi_with`)."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"content": {"application/json": {"schema": ref}}, "required": True}


def _exact_integer_bounds(schema: dict) -> None:
    """FastAPI's document writes a parameter's integer bounds as floats: ``MAX_ID`` (2^63 − 1) becomes 2^63,
    which the service refuses. Written back as the integers they are."""
    if schema.get("type") != "integer":
        return
    for key in ("minimum", "maximum"):
        if isinstance(schema.get(key), float):
            schema[key] = MAX_ID if schema[key] >= MAX_ID else int(schema[key])


def _openapi_with(
    app: FastAPI, routers: Iterable[APIRouter], models: tuple[type[BaseModel], ...], settings: ServiceSettings
):
    """``app.openapi``, completed: the schemas of ``models`` (and of the models they nest) in its components,
    and each operation's bearer requirement as this service enforces it (none without ``--token-file``; the
    read endpoints of ``routers`` only with ``--protect-reads``)."""
    generate = app.openapi
    reads = {
        (method.lower(), route.path)
        for router in routers
        for route in router.routes
        if isinstance(route, APIRoute) and any(d.dependency is require_read_token for d in route.dependencies)
        for method in route.methods
    }

    def openapi() -> dict:
        if app.openapi_schema is None:
            document = generate()
            components = document.setdefault("components", {}).setdefault("schemas", {})
            for model in models:
                schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(schema.pop("$defs", {}))
                components[model.__name__] = schema
            for path, operations in document["paths"].items():
                for method, operation in operations.items():
                    for parameter in operation.get("parameters", []):
                        _exact_integer_bounds(parameter.get("schema", {}))
                    open_read = (method, path) in reads and not settings.protect_reads
                    if settings.token_file is None or open_read:
                        operation.pop("security", None)
                        operation.get("responses", {}).pop("401", None)
            app.openapi_schema = document
        return app.openapi_schema

    return openapi


# --------------------------------------------------------------------------- routes


def _json(model: BaseModel) -> Response:
    """``model`` as JSON. The hot routes return it this way: FastAPI would validate the model a second time."""
    return Response(model.model_dump_json(), media_type="application/json")


scoring = APIRouter(prefix="/v1", tags=["scoring"])


def _or_422(body: ModelT | bytes) -> ModelT | Response:
    """A parsed body, or its 422 error body (bytes) as the response."""
    return Response(body, status_code=422, media_type="application/json") if isinstance(body, bytes) else body


async def _body_of(request: Request, model: type[ModelT]) -> ModelT | Response:
    """The request's body validated as ``model`` (:func:`parse_json_body`), or its 422."""
    return _or_422(parse_json_body(await request.body(), model))


async def _score_body(request: Request) -> ScoreRequestIn | Response:
    """The request's validated body, or its 422. A body over ``heavy_body_bytes`` is parsed, validated and
    its tokens hashed in the worker pool (:mod:`kvcost.serving.heavy`), not on the event loop."""
    raw = await request.body()
    if len(raw) <= request.app.state.heavy_body_bytes:
        body = parse_json_body(raw, ScoreRequestIn)
    else:
        body = await request.app.state.heavy.parse_score(raw)
    return _or_422(body)


@scoring.post(
    "/score",
    response_model=ScoreResponse,
    dependencies=ReadAuth,
    responses={**_ERRORS, 503: _BUSY},
    openapi_extra={"requestBody": _json_body_of(ScoreRequestIn)},
)
async def score(request: Request, service: ServiceDep) -> Response:
    """Score every candidate: predicted terms, composed and calibrated TTFT, reuse; no routing side effects."""
    body = await _score_body(request)
    return body if isinstance(body, Response) else _json(service.score(body))


@scoring.post(
    "/route",
    response_model=RouteResponse,
    dependencies=WriteAuth,
    responses={**_ERRORS, 409: _CONFLICT, 503: _BUSY},
    openapi_extra={"requestBody": _json_body_of(ScoreRequestIn)},
)
async def route(request: Request, service: ServiceDep) -> Response:
    """Choose a worker; record the decision (features and predictions) for ``/v1/observe``."""
    body = await _score_body(request)
    return body if isinstance(body, Response) else _json(service.route(body))


observations = APIRouter(prefix="/v1", tags=["observations"])


@observations.post(
    "/observe",
    response_model=ObservationResponse,
    dependencies=WriteAuth,
    responses={**_ERRORS, 503: _UNCOMMITTED},
    openapi_extra={"requestBody": _json_body_of(ObservationIn)},
)
async def observe(request: Request, service: ServiceDep) -> Response:
    """Record a routed request's actual times; durable when answered; a repeated id answers ``duplicate``, an id
    with no decision (lost in a crash before its commit) is recorded as ``unjoined``, never refused. An observation
    with ``output_tokens`` and ``e2e_s`` (the request finished) also feeds the router's estimate of what a decoding
    request has left to generate (``Router.on_finished``)."""
    body = await _body_of(request, ObservationIn)
    return body if isinstance(body, Response) else _json(await service.observe(body))


workers = APIRouter(prefix="/v1/workers", tags=["workers"])

_CANONICAL_INTEGER = re.compile(r"0|[1-9][0-9]*")


def _canonical_integer(value: object) -> object:
    """A path id as written in decimal digits only ("7"), never "+7", "07", "7.0" or " 7".

    Pydantic's lax mode reads all of these as 7, so one worker had many spellings, and the
    OpenAPI type (integer) was not what was checked. ``Path`` comes first in the annotation:
    after a validator, FastAPI writes its bounds as ``ge``/``le`` instead of OpenAPI's
    ``minimum``/``maximum``.

    Raises:
        ValueError: a string in another form (FastAPI answers 422 naming the path parameter).
    """
    if isinstance(value, str) and not _CANONICAL_INTEGER.fullmatch(value):
        raise ValueError(f"expected an integer in decimal digits without sign or leading zeros, got {value!r}")
    return value


WorkerIdPath = Annotated[int, Path(ge=0, le=MAX_ID), BeforeValidator(_canonical_integer)]


@workers.post(
    "/{worker_id}/snapshot",
    response_model=SnapshotAck,
    dependencies=WriteAuth,
    responses=_ERRORS,
    openapi_extra={"requestBody": _json_body_of(SnapshotIn)},
)
async def push_snapshot(worker_id: WorkerIdPath, request: Request, service: ServiceDep) -> Response:
    """Store the worker's load snapshot, used for candidates that carry none inline."""
    body = await _body_of(request, SnapshotIn)
    return body if isinstance(body, Response) else _json(service.push_snapshot(worker_id, body))


eviction = APIRouter(prefix="/v1/evict", tags=["eviction"])


@eviction.post(
    "/rank",
    response_model=EvictRankResponse,
    dependencies=ReadAuth,
    responses={**_ERRORS, 503: _BUSY},
    openapi_extra={"requestBody": _json_body_of(EvictRankIn)},
)
async def evict_rank(request: Request) -> Response:
    """Idle cached prefix nodes in eviction order under a registered policy, each with its value terms.

    Parsed, validated and ranked in a worker process (:mod:`kvcost.serving.heavy`): a 100,000-node
    body costs seconds of CPU, which must not stall the event loop; 503 with ``Retry-After`` when
    the pool's queue is full."""
    status, content = await request.app.state.heavy.rank(await request.body())
    return Response(content, status_code=status, media_type="application/json")


models = APIRouter(prefix="/v1/cost-models", tags=["models"])


@models.get("", response_model=ModelsResponse, dependencies=ReadAuth, responses={401: _ERRORS[401]})
async def list_models(service: ServiceDep) -> ModelsResponse:
    """The serving model, the registry's versions (champion, challenger …) and the feature-spec hash."""
    return await service.models_info()


@models.post("/reload", response_model=ModelStatusOut, dependencies=WriteAuth, responses={401: _ERRORS[401]})
async def reload_models(service: ServiceDep) -> ModelStatusOut:
    """Load the champion again (after a promotion, or to retry after a failure)."""
    await service.load_model()
    return service.model_status_out()


health = APIRouter(tags=["health"])


@health.get("/healthz", response_model=HealthResponse)
async def healthz() -> HealthResponse:
    """Liveness: the process answers."""
    return HealthResponse(status="ok")


@health.get("/readyz", response_model=ReadinessResponse, responses={503: {"model": ReadinessResponse}})
async def readyz(service: ServiceDep) -> JSONResponse:
    """200 ``ready`` or ``degraded`` (analytic fallback; the reason says why), 503 ``starting`` / ``unavailable``."""
    status, reason = service.readiness()
    body = ReadinessResponse(status=status, reason=reason, model=service.model_status.label)
    return JSONResponse(body.model_dump(), status_code=200 if status in ("ready", "degraded") else 503)


@health.get("/metrics", response_class=Response)
async def metrics(service: ServiceDep) -> Response:
    """Prometheus metrics of this service instance."""
    return Response(service.metrics.render(), media_type=CONTENT_TYPE_LATEST)


# ---------------------------------------------------------------------- error shape


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    return JSONResponse(validation_error_body(exc.errors()), status_code=422)


async def _field_error(request: Request, exc: FieldError) -> JSONResponse:
    return JSONResponse(field_error_body(exc.loc, exc.message), status_code=422)


async def _busy(request: Request, exc: PoolBusyError) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=503, headers={"Retry-After": str(exc.retry_after_s)})


async def _client_gone(request: Request, exc: ClientDisconnect) -> Response:
    """A handler that was reading the body of a connection already closed (a client gone, or one the
    read timeout closed, :mod:`kvcost.serving.http_protocol`, which logs why): no response can be sent,
    and no traceback is logged. 499 is nginx's "client closed request", for the access log."""
    return Response(status_code=499)


def _status_handler(status: int):
    async def handler(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=status)

    return handler


# -------------------------------------------------------------------------- factory


def kv_event_subscriber(settings: ServiceSettings, service: ScoringService) -> KVEventSubscriber | None:
    """A subscriber feeding ``settings.kv_events`` into the service's directory (under its lock), or None."""
    if not settings.kv_events:
        return None
    namespace = settings.event_namespace()
    ingestor = KVEventIngestor(service.directory, lambda worker_id: namespace, hash_algorithm=settings.hash_algorithm)
    sources = [parse_kv_event_source(spec) for spec in settings.kv_events]
    ingestor.expect_workers(source.worker_id for source in sources)
    return KVEventSubscriber(
        ingestor, sources, clock=service.clock, lock=service.lock, replay_timeout_s=settings.kv_replay_timeout_s
    )


def _check_reuse_model(settings: ServiceSettings) -> None:
    """Load the P(reuse) model in ``settings.reuse_model_dir`` once, so that a bad one fails at start (the
    ranking workers load their own); errors name the setting."""
    if settings.reuse_model_dir is None:
        return
    try:
        load_reuse_model(settings.reuse_model_dir)
    except (FileNotFoundError, ValueError) as exc:
        raise ValueError(f"reuse_model_dir = {str(settings.reuse_model_dir)!r}: {exc}") from None


def create_app(settings: ServiceSettings, service: ScoringService | None = None) -> FastAPI:
    """Build the API around a :class:`ScoringService` (default: one built from ``settings``).

    Pure apart from reading the token file and the reuse model: the log opens
    and the champion loads in the app's lifespan (uvicorn startup, or entering
    a TestClient).

    Raises:
        FileNotFoundError, ValueError: the token file is missing or empty, or
            ``reuse_model_dir`` holds no usable reuse model.
    """
    token = read_token(settings.token_file) if settings.token_file is not None else None
    _check_reuse_model(settings)
    service = service if service is not None else ScoringService(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service.start()
        subscriber = kv_event_subscriber(settings, service)
        if subscriber is not None:
            subscriber.start()
        app.state.kv_subscriber = service.kv_subscriber = subscriber
        ingestor = subscriber.ingestor if subscriber is not None else None
        client = engine_client(settings) if settings.engines else None
        fresh_client = engine_client(settings, fresh=True) if settings.engines else None
        liveness = EngineLiveness(service.directory, service.lock, service.clock, ingestor)
        if client is not None and fresh_client is not None:
            app.state.gateway = build_gateway(settings, service, client, fresh_client, liveness)
            liveness.on_new_process = app.state.gateway.engines.succeeded
        scraper = engine_scraper(settings, service, liveness, app.state.gateway.load if client is not None else None)
        if scraper is not None:
            scraper.start()
        app.state.engine_scraper = scraper
        loading = asyncio.create_task(service.load_model())
        watching = asyncio.create_task(watch_loop_lag(service.metrics.event_loop_lag))
        if app.state.warm_heavy:
            app.state.heavy.warm()
        try:
            yield
        finally:
            for task in (loading, watching):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            if scraper is not None:
                await scraper.stop()
            for session in (client, fresh_client):
                if session is not None:
                    await session.close()
            if subscriber is not None:
                subscriber.stop()
            app.state.heavy.shutdown()
            service.stop()

    app = FastAPI(
        title="kvcost scoring API",
        version=API_VERSION,
        summary="Per-candidate TTFT terms, cache-aware routing decisions, and their logged outcomes.",
        lifespan=lifespan,
    )
    app.state.service = service
    app.state.token = token
    app.state.protect_reads = settings.protect_reads
    app.state.heavy = HeavyPool(settings)
    app.state.heavy_body_bytes = settings.heavy_body_bytes
    #: Start the heavy-request workers with the app (``kvcost serve`` does; tests' apps start them when used).
    app.state.warm_heavy = False
    app.add_middleware(
        BodySizeLimitMiddleware,
        max_body_bytes=settings.max_body_bytes,
        path_limits={"/v1/evict/rank": settings.max_rank_body_bytes},
    )
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(FieldError, _field_error)
    app.add_exception_handler(ConflictError, _status_handler(409))
    app.add_exception_handler(LogUnavailableError, _status_handler(503))
    app.add_exception_handler(PoolBusyError, _busy)
    app.add_exception_handler(OpenAIError, openai_error_response)
    app.add_exception_handler(ClientDisconnect, _client_gone)
    routers = (scoring, observations, workers, eviction, models, health)
    for router in routers:
        app.include_router(router)
    # every request body's schema as pydantic writes it (FastAPI's document writes integer bounds as floats)
    app.openapi = _openapi_with(app, routers, (EvictRankIn, ScoreRequestIn, ObservationIn, SnapshotIn), settings)
    if settings.engines:
        app.include_router(openai)
    return app
