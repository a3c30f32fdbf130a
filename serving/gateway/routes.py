"""The gateway's HTTP surface (``kvcost serve --engine W=URL …``) and its construction.

===================================  =====  ===============================================================
route                                token  does
===================================  =====  ===============================================================
``POST /v1/completions``             yes    route, forward to the chosen engine (streamed or not), log
``POST /v1/chat/completions``        yes    the same, tokenized through the chat template
``GET /v1/models``                          OpenAI's list of the models the engines serve
===================================  =====  ===============================================================

"token": the bearer token of ``--token-file``, as on the write endpoints (OpenAI
clients send their API key that way); a missing or wrong one answers 401 in
OpenAI's error shape. Every error of these routes has that shape
(:class:`~kvcost.serving.gateway.sse.OpenAIError`).
"""

from __future__ import annotations

import asyncio
import hmac
import time
from typing import Any

import aiohttp
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from kvcost.serving.engines.liveness import EngineLiveness
from kvcost.serving.gateway.engines import EnginePool
from kvcost.serving.gateway.proxy import Gateway
from kvcost.serving.gateway.sse import OpenAIError
from kvcost.serving.gateway.tokenize import EngineTokenizer, LocalTokenizer, PromptTokenizer
from kvcost.serving.service import ScoringService
from kvcost.serving.settings import ServiceSettings, parse_engine


async def require_api_key(request: Request) -> None:
    """401 in OpenAI's shape unless ``Authorization: Bearer <token>`` matches ``--token-file`` (constant-time)."""
    expected: str | None = request.app.state.token
    if expected is None:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected.encode()):
        raise OpenAIError(401, "missing or wrong bearer token (Authorization: Bearer <token>)", "authentication_error")


async def require_api_key_for_reads(request: Request) -> None:
    """:func:`require_api_key` on ``GET /v1/models``, only when the service runs with ``--protect-reads``."""
    if request.app.state.protect_reads:
        await require_api_key(request)


openai = APIRouter(tags=["openai"])


def _gateway(request: Request) -> Gateway:
    return request.app.state.gateway


@openai.post("/v1/completions", dependencies=[Depends(require_api_key)])
async def completions(request: Request) -> Response:
    """OpenAI completions, routed by kvcost to one engine and forwarded (streamed or not)."""
    return await _gateway(request).handle("/v1/completions", request)


@openai.post("/v1/chat/completions", dependencies=[Depends(require_api_key)])
async def chat_completions(request: Request) -> Response:
    """OpenAI chat completions, tokenized through the chat template, routed and forwarded."""
    return await _gateway(request).handle("/v1/chat/completions", request)


@openai.get("/v1/models", dependencies=[Depends(require_api_key_for_reads)])
async def list_models(request: Request) -> JSONResponse:
    """OpenAI's model list: the union of what the engines answer (by model id), in engine order."""
    gateway = _gateway(request)
    answers = await asyncio.gather(*(_models_of(gateway.client, url) for url in gateway.engines.urls.values()))
    seen: dict[str, dict[str, Any]] = {}
    for models in answers:
        for model in models or ():
            seen.setdefault(model.get("id"), model)
    if not any(a is not None for a in answers):
        raise OpenAIError(502, "no engine answered GET /v1/models", "engine_error")
    return JSONResponse({"object": "list", "data": list(seen.values())})


async def _models_of(client: aiohttp.ClientSession, url: str) -> list[dict[str, Any]] | None:
    try:
        async with client.get(f"{url}/v1/models") as response:
            if response.status >= 400:
                return None
            data = (await response.json(content_type=None)).get("data")
    except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError):
        return None
    return [m for m in data if isinstance(m, dict)] if isinstance(data, list) else None


async def openai_error_response(request: Request, exc: OpenAIError) -> JSONResponse:
    """The exception handler of :class:`OpenAIError`."""
    return JSONResponse(exc.body(), status_code=exc.status)


def build_gateway(
    settings: ServiceSettings,
    service: ScoringService,
    client: aiohttp.ClientSession,
    fresh_client: aiohttp.ClientSession,
    liveness: EngineLiveness,
) -> Gateway:
    """The gateway of ``settings.engines``: local tokenizer with ``settings.tokenizer``, else the first engine's.

    ``client`` and ``fresh_client`` are :func:`engine_client`'s pooled client and its ``fresh`` one.

    Raises:
        ValueError: ``settings.tokenizer`` holds no loadable tokenizer.
    """
    urls = dict(parse_engine(spec) for spec in settings.engines)
    engines = EnginePool(urls, time.monotonic, settings.engine_backoff_s, settings.engine_backoff_max_s)
    tokenizer: PromptTokenizer
    if settings.tokenizer is not None:
        tokenizer = LocalTokenizer(settings.tokenizer)
    else:
        tokenizer = EngineTokenizer(client, fresh_client, next(iter(urls.values())))
    return Gateway(service, engines, tokenizer, liveness, client, fresh_client, settings.gpu_default)
