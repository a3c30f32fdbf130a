"""The gateway: route each OpenAI request with the embedded router, forward it, measure it, log it.

Per request (``POST /v1/completions`` or ``/v1/chat/completions``):

1. **tokenize** the prompt (:mod:`kvcost.serving.gateway.tokenize`) and hash it as the
   engines do (:meth:`Routing.token_request`; the request's ``cache_salt`` included);
2. **route** among the engines not backing off, each described by what the gateway
   sent it and its last scrape (:class:`~kvcost.serving.gateway.load.SentLoad`), and
   record the decision (``candidates``), as ``/v1/route`` does;
3. **forward** the body unchanged (unknown fields included) to the chosen engine,
   asking a streamed request for its usage (``stream_options.include_usage``; removed
   again from what the client receives unless it asked) and passing the client's
   request id as ``X-Request-Id``;
4. **measure**: TTFT at the first chunk carrying output (streamed requests; a
   non-streamed response gives only the end-to-end time, and its TTFT is logged as
   unknown), the engine's ``cached_tokens`` as the actual reuse, its queue time
   (vLLM's per-request ``metrics.queue_time_ms``, sent by engines started with
   ``--enable-per-request-metrics``, in the last chunk or the whole response),
   generated tokens, TPOT; what the engine does not report (the queue without that
   flag; lookup, transfer, prefill and first-token work always) is logged as
   unknown, never as 0;
5. **log** the request's ``requests`` row with its outcome (:meth:`ScoringService.record_measured`).

Failures: an engine that refuses the connection, times out, answers 5xx or ends the
stream before the first chunk is marked failed (backoff, and unknown in the
directory when unreachable) and the request is routed once more among the others;
the client has received nothing yet, because the response starts only with the
first chunk. A reused connection the engine closed as the request was sent on it is no
failure: the request goes once more to the same engine on a new connection (:func:`post`).
An engine that fails after the first chunk ends the client's stream with an error event
naming it (tokens were sent; it cannot be retried). A client that disconnects cancels the
engine's request (the connection to it is closed, which vLLM takes as an abort); what was
measured is logged. One that disconnects before its body has arrived is answered 499
(nothing was routed or logged). Every request ends as a response or an error naming the
engine, and is logged with its outcome.

Thread safety: the event loop only (the service's lock guards the directory).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.requests import ClientDisconnect

from kvcost.core.types import RouteDecision, WorkerSnapshot
from kvcost.serving.engines.liveness import EngineLiveness
from kvcost.serving.gateway.engine_http import post
from kvcost.serving.gateway.engines import EnginePool
from kvcost.serving.gateway.load import SentLoad
from kvcost.serving.gateway.sse import (
    Event,
    EventReader,
    OpenAIError,
    cached_tokens,
    completion_tokens,
    queue_time_s,
    without_usage,
)
from kvcost.serving.gateway.tokenize import PromptTokenizer, TokenizeError
from kvcost.serving.model_loading import one_line
from kvcost.serving.outcomes import MeasuredOutcome
from kvcost.serving.service import ScoringService

logger = logging.getLogger(__name__)
#: Decision ids: 62 random bits from a generator seeded by the OS (``secrets`` would read /dev/urandom per call).
_IDS = random.Random()

#: The two OpenAI endpoints the gateway routes: path → tokenizer method.
ENDPOINTS = {"/v1/completions": "completion_ids", "/v1/chat/completions": "chat_ids"}
#: Transport failures after which an engine is taken as down (unknown in the directory), not merely failing.
_UNREACHABLE = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
#: Every transport failure of the engine leg (a read timeout is a ``TimeoutError``).
_TRANSPORT_ERRORS = (aiohttp.ClientError, TimeoutError)


class _EngineFailedError(Exception):
    """The engine failed before the client received anything: the request may go elsewhere."""

    def __init__(self, worker_id: int, reason: str, unreachable: bool) -> None:
        super().__init__(reason)
        self.worker_id = worker_id
        self.reason = reason
        self.unreachable = unreachable


@dataclass(slots=True)
class _Attempt:
    """One routed attempt of a client request, and what was measured of it."""

    decision_id: int
    worker_id: int
    started: float  # perf_counter at the client request's arrival
    client_id: str
    directory_tokens: int = 0
    ttft_s: float | None = None
    usage: dict[str, Any] | None = None
    queue_s: float | None = None
    chunks: int = 0
    outcome: str = "ok"
    logged: bool = field(default=False)


class Gateway:
    """OpenAI-compatible proxy in front of the engines (one per app).

    Args:
        service: the scoring service (router, directory, decisions, log, metrics).
        engines: the engines' URLs and failure backoff.
        tokenizer: how prompts are tokenized.
        liveness: marks unreachable engines unknown in the directory.
        client: HTTP client to the engines, pooling connections (timeouts set by the caller:
            :func:`~kvcost.serving.gateway.engine_http.engine_client`).
        fresh_client: the same without a pool, for a request sent again after an engine closed a
            pooled connection under it (:func:`~kvcost.serving.gateway.engine_http.post`).
        gpu: GPU type of every engine (the service's default).
    """

    def __init__(
        self,
        service: ScoringService,
        engines: EnginePool,
        tokenizer: PromptTokenizer,
        liveness: EngineLiveness,
        client: aiohttp.ClientSession,
        fresh_client: aiohttp.ClientSession,
        gpu: str,
    ) -> None:
        self.service = service
        self.engines = engines
        self.tokenizer = tokenizer
        self.liveness = liveness
        self.client = client
        self.fresh_client = fresh_client
        self.gpu = gpu
        self.load = SentLoad()

    # ------------------------------------------------------------------ entry

    async def handle(self, path: str, request: Request) -> Response:
        """Answer one OpenAI request on ``path`` (a key of :data:`ENDPOINTS`).

        Raises:
            OpenAIError: bad body (400), tokenization failed (400 / 502), every tried engine failed (502).
        """
        started = time.perf_counter()
        arrival_s = self.service.clock()
        body = await _json_body(request)
        client_id = _client_request_id(request, body)
        token_ids = await self._tokenize(path, body)
        stream = body.get("stream") is True
        salt = body.get("cache_salt")
        if salt is not None and not isinstance(salt, str):
            raise OpenAIError(400, f"cache_salt = {salt!r}, expected a string", param="cache_salt")
        tried: list[int] = []
        while True:
            attempt = self._route(token_ids, arrival_s, salt, tried, started, client_id)
            try:
                if stream:
                    return await self._stream(path, body, attempt, request)
                return await self._whole(path, body, attempt)
            except _EngineFailedError as failed:
                tried.append(failed.worker_id)
                retry = len(tried) < 2 and bool(self.engines.available(exclude=tried))
                self._engine_failed(attempt, failed, "retried on another engine" if retry else "not retried")
                if not retry:
                    names = ", ".join(f"engine {w} ({self.engines.urls[w]})" for w in tried)
                    message = f"{names} failed before the first token: {failed.reason}"
                    raise OpenAIError(502, message, "engine_error") from None
            except BaseException as exc:  # cancelled (the client left) or a bug: logged, never lost silently
                cancelled = isinstance(exc, asyncio.CancelledError)
                attempt.outcome = f"{'cancelled' if cancelled else 'failed'} before the first token: {one_line(exc)}"
                self._log(attempt, "cancelled" if cancelled else "engine_error", e2e=False)
                raise

    async def _tokenize(self, path: str, body: dict[str, Any]) -> list[int]:
        start = time.perf_counter()
        try:
            ids = await getattr(self.tokenizer, ENDPOINTS[path])(body)
        except TokenizeError as exc:
            kind = "invalid_request_error" if exc.status < 500 else "engine_error"
            raise OpenAIError(exc.status, str(exc), kind) from None
        self.service.metrics.gateway_tokenize.labels(self.tokenizer.source).observe(time.perf_counter() - start)
        if not ids:
            raise OpenAIError(400, "the prompt has no tokens", param="prompt")
        return ids

    # ---------------------------------------------------------------- routing

    def _route(
        self, token_ids: list[int], arrival_s: float, salt: str | None, tried: list[int], started: float, client: str
    ) -> _Attempt:
        decision_id = _IDS.getrandbits(62)  # unique, not secret: no system call per request
        routing = self.service.routing
        request = routing.token_request(decision_id, token_ids, arrival_s, salt)
        workers = self.engines.available(exclude=tried)
        snapshots = [self._snapshot(w) for w in workers]
        now_s = self.service.clock()
        ages = {w: self._scrape_age_s(w, now_s) for w in workers}
        ttl_s = self.service.settings.in_flight_gateway_ttl_s  # every attempt's outcome is logged (_log)
        _, decision = self.service.route_resolved(
            request, snapshots, dict.fromkeys(workers, "gateway"), ages, in_flight_ttl_s=ttl_s
        )
        block = request.namespace.block_size_tokens
        held = decision.directory_blocks[decision.chosen_index]
        reusable = _reusable(decision, request.input_tokens)
        cached_prefix = request.block_hashes[: min(held, reusable // block)]
        self.load.routed(
            decision_id, decision.worker_id, request.input_tokens, reusable, cached_prefix, request.block_hashes
        )
        return _Attempt(
            decision_id, decision.worker_id, started, client, engine_cached_tokens(held, block, len(token_ids))
        )

    def _snapshot(self, worker_id: int) -> WorkerSnapshot:
        stored = self.service.routing.snapshots.get(worker_id)
        scraped, scraped_at_s = stored if stored is not None else (None, None)
        block = self.service.settings.block_size_tokens
        return self.load.snapshot(worker_id, self.gpu, scraped, block, scraped_at_s)

    def _scrape_age_s(self, worker_id: int, now_s: float) -> float:
        stored = self.service.routing.snapshots.get(worker_id)
        return max(0.0, now_s - stored[1]) if stored is not None else 0.0

    # ------------------------------------------------------------- forwarding

    def _engine_request(
        self, path: str, body: dict[str, Any], attempt: _Attempt, stream: bool
    ) -> tuple[str, bytes, dict[str, str]]:
        """The engine's URL, the body to send and its headers."""
        if stream:
            options = dict(body.get("stream_options") or {})
            options["include_usage"] = True
            body = {**body, "stream_options": options}
        headers = {"content-type": "application/json", "x-request-id": attempt.client_id}
        return self.engines.urls[attempt.worker_id] + path, json.dumps(body).encode(), headers

    async def _send(self, request: tuple[str, bytes, dict[str, str]], attempt: _Attempt) -> aiohttp.ClientResponse:
        """Send and read the response head (:func:`post`); a transport failure or a 5xx is
        :class:`_EngineFailedError` (retry elsewhere). The caller releases the response (``release()``
        returns its connection to the pool, ``close()`` drops it, which is how an engine learns that a
        request was abandoned)."""
        url, data, headers = request

        def sent_again(reason: str) -> None:
            self.service.metrics.gateway_connection_retries.labels(str(attempt.worker_id)).inc()
            logger.info("engine %d closed a reused connection (%s); sent again on a new one", attempt.worker_id, reason)

        try:
            response = await post(self.client, self.fresh_client, url, data, headers, sent_again)
        except _TRANSPORT_ERRORS as exc:
            raise _EngineFailedError(attempt.worker_id, one_line(exc), isinstance(exc, _UNREACHABLE)) from None
        if response.status >= 500:
            try:
                text = (await response.read())[:300].decode(errors="replace")
            except _TRANSPORT_ERRORS as exc:
                text = one_line(exc)
            response.close()
            raise _EngineFailedError(attempt.worker_id, f"HTTP {response.status}: {text}", False)
        return response

    async def _whole(self, path: str, body: dict[str, Any], attempt: _Attempt) -> Response:
        response = await self._send(self._engine_request(path, body, attempt, stream=False), attempt)
        try:
            content = await response.read()
        except _TRANSPORT_ERRORS as exc:
            response.close()
            raise _EngineFailedError(attempt.worker_id, one_line(exc), False) from None
        response.release()
        if response.status < 400:
            self.engines.succeeded(attempt.worker_id)
            try:
                answer = json.loads(content)
            except ValueError:
                answer = None
            if isinstance(answer, dict):
                attempt.usage = answer.get("usage")
                attempt.queue_s = queue_time_s(answer)
            attempt.outcome = "ok"
            kind = "ok"
        else:
            attempt.outcome = f"engine {attempt.worker_id} answered HTTP {response.status}"
            kind = "client_error"
        self._log(attempt, kind, e2e=True)
        return Response(content, response.status, self._headers(attempt), response.headers.get("content-type"))

    async def _stream(self, path: str, body: dict[str, Any], attempt: _Attempt, request: Request) -> Response:
        """Open the engine's stream and read it up to the first chunk with output, then stream to the client."""
        wants_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        response = await self._send(self._engine_request(path, body, attempt, stream=True), attempt)
        if response.status >= 400:  # the engine refused the request itself: pass its answer on
            content = await response.read()
            response.release()
            attempt.outcome = f"engine {attempt.worker_id} answered HTTP {response.status}"
            self._log(attempt, "client_error", e2e=False)
            return Response(content, response.status, self._headers(attempt), response.headers.get("content-type"))
        chunks = response.content.iter_any()
        reader = EventReader()
        head: list[Event] = []
        try:
            while not any(e.has_choices or e.done or (e.chunk and "error" in e.chunk) for e in head):
                head.extend(reader.feed(await anext(chunks)))
        except (StopAsyncIteration, *_TRANSPORT_ERRORS) as exc:
            response.close()
            ended = isinstance(exc, StopAsyncIteration)
            reason = "the stream ended before the first token" if ended else one_line(exc)
            raise _EngineFailedError(attempt.worker_id, reason, isinstance(exc, _UNREACHABLE)) from None
        except BaseException:  # cancelled while waiting for the first token: the engine's request goes too
            response.close()
            raise
        self.engines.succeeded(attempt.worker_id)
        events = self._forward(attempt, response, chunks, reader, head, wants_usage)
        return StreamingResponse(events, media_type="text/event-stream", headers=self._headers(attempt))

    async def _forward(
        self,
        attempt: _Attempt,
        response: aiohttp.ClientResponse,
        chunks: AsyncIterator[bytes],
        reader: EventReader,
        head: list[Event],
        wants_usage: bool,
    ) -> AsyncIterator[bytes]:
        """The client's stream: the events read so far, then the rest as it arrives; logs the attempt at the end."""
        done = False
        kind = "cancelled"
        attempt.outcome = "cancelled: the client disconnected"
        try:
            for event in head:
                done = self._measure(attempt, event) or done
                out = event.raw if wants_usage else without_usage(event)
                if out:
                    yield out
            while not done:
                try:
                    data = await anext(chunks)
                except StopAsyncIteration:
                    break
                for event in reader.feed(data):
                    done = self._measure(attempt, event) or done
                    out = event.raw if wants_usage else without_usage(event)
                    if out:
                        yield out
            if done:
                attempt.outcome, kind = "ok", "ok"
            else:
                raise aiohttp.ClientPayloadError("the stream ended without [DONE]")
        except _TRANSPORT_ERRORS as exc:
            url = self.engines.urls[attempt.worker_id]
            message = f"engine {attempt.worker_id} ({url}) failed mid-stream after {attempt.chunks} chunks: "
            error = OpenAIError(502, message + one_line(exc), "engine_error")
            attempt.outcome, kind = error.message, "failed_mid_stream"
            self.engines.failed(attempt.worker_id, one_line(exc))
            yield error.event()
        finally:
            self._log(attempt, kind, e2e=kind == "ok")
            if done:
                response.release()
            else:
                response.close()  # drops the connection: the engine aborts the unfinished request

    def _measure(self, attempt: _Attempt, event: Event) -> bool:
        """Read one event: first token, output chunks, usage. Returns whether it ends the stream."""
        chunk = event.chunk
        if event.has_choices:
            attempt.chunks += 1
            if attempt.ttft_s is None:
                attempt.ttft_s = time.perf_counter() - attempt.started
                self.load.first_token(attempt.decision_id)
            else:
                self.load.generated(attempt.decision_id, attempt.chunks)
        if chunk is not None and chunk.get("usage"):
            attempt.usage = chunk["usage"]
        if chunk is not None and chunk.get("metrics"):
            attempt.queue_s = queue_time_s(chunk)
        return event.done

    # ---------------------------------------------------------------- logging

    def _headers(self, attempt: _Attempt) -> dict[str, str]:
        return {
            "x-request-id": attempt.client_id,
            "x-kvcost-worker": str(attempt.worker_id),
            "x-kvcost-decision": str(attempt.decision_id),
        }

    def _engine_failed(self, attempt: _Attempt, failed: _EngineFailedError, then: str) -> None:
        url = self.engines.urls[failed.worker_id]
        self.engines.failed(failed.worker_id, failed.reason)
        if failed.unreachable:
            self.liveness.unreachable(failed.worker_id)
        attempt.outcome = f"engine {failed.worker_id} ({url}) failed before the first token: {failed.reason}; {then}"
        self._log(attempt, "failed_before_first_token", e2e=False)

    def _log(self, attempt: _Attempt, kind: str, e2e: bool) -> None:
        """Log the attempt once: its ``requests`` row, the gateway counters; its load is released."""
        if attempt.logged:
            return
        attempt.logged = True
        self.load.finished(attempt.decision_id)
        elapsed_s = time.perf_counter() - attempt.started
        output = completion_tokens(attempt.usage)
        tpot_s = None
        if e2e and attempt.ttft_s is not None and output is not None and output > 1:
            tpot_s = (elapsed_s - attempt.ttft_s) / (output - 1)
        measured = MeasuredOutcome(
            request_id=attempt.decision_id,
            ttft_s=attempt.ttft_s,
            queue_s=attempt.queue_s,
            e2e_s=elapsed_s if e2e else None,
            tpot_s=tpot_s,
            output_tokens=output,
            actual_reuse_tokens=cached_tokens(attempt.usage),
            directory_reuse_tokens=attempt.directory_tokens,
            client_request_id=attempt.client_id,
            outcome=attempt.outcome,
        )
        metrics = self.service.metrics
        metrics.gateway_requests.labels(str(attempt.worker_id), kind).inc()
        if attempt.ttft_s is not None:
            metrics.gateway_ttft.observe(attempt.ttft_s)
        try:
            self.service.record_measured(measured)
        except Exception:  # the request is answered whatever happens to its log row
            logger.exception("request %s (decision %d) not logged", attempt.client_id, attempt.decision_id)


#: The status answered to a client that left before its request body arrived (nginx's "client closed
#: request"; no one reads it, but the access log and the ASGI server see a handled request, not a crash).
CLIENT_CLOSED_REQUEST = 499


async def _json_body(request: Request) -> dict[str, Any]:
    """The request's JSON object.

    Raises:
        OpenAIError: 400 when the body is not a JSON object or ``stream`` is not a boolean; 499 when the
            client disconnected before the whole body arrived (nothing was routed, nothing is logged).
    """
    try:
        raw = await request.body()
    except ClientDisconnect:
        raise OpenAIError(CLIENT_CLOSED_REQUEST, "the client disconnected before its request body arrived") from None
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise OpenAIError(400, f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise OpenAIError(400, f"the body is a JSON {type(body).__name__}, expected an object")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise OpenAIError(400, f"stream = {body['stream']!r}, expected true or false", param="stream")
    return body


def _client_request_id(request: Request, body: dict[str, Any]) -> str:
    """The client's id: ``X-Request-Id``, else the body's ``request_id``, else a new ``kvcost-<hex>``."""
    given = request.headers.get("x-request-id") or body.get("request_id")
    if isinstance(given, str) and 0 < len(given) <= 256:
        return given
    return f"kvcost-{secrets.token_hex(12)}"


def engine_cached_tokens(blocks: int, block_size_tokens: int, input_tokens: int) -> int:
    """Tokens vLLM takes from its prefix cache for a prompt of ``input_tokens`` whose first ``blocks`` full
    blocks are cached: at most ``input_tokens − 1`` (the last token is computed for its logits), rounded down
    to whole blocks (vLLM 0.32 ``KVCacheManager.get_computed_blocks``: ``max_cache_hit_length = num_tokens − 1``,
    and hits are block-aligned)."""
    return min(blocks, max(0, input_tokens - 1) // block_size_tokens) * block_size_tokens


def _reusable(decision: RouteDecision, input_tokens: int) -> int:
    """The reuse the gateway counts the request's queued work net of: what the router expects to survive
    until admission (``RouteDecision.queued_reuse_tokens``), at most the prompt."""
    return min(input_tokens, decision.queued_reuse_tokens())
