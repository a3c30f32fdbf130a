"""Traffic for the end-to-end tests: a slice of the bundled Mooncake conversation trace as OpenAI requests.

Each Mooncake hash id stands for one 512-token block of the original prompt;
here it becomes a deterministic block of 32 token ids (the engines' block size),
so that requests sharing hash ids share exact token prefixes. Completions send
the token ids as the prompt; chat requests send a deterministic text per hash id
(tokenized by the gateway through the chat template, as the engine does), so
their shared prefixes are shared text.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

BLOCK_TOKENS = 32
#: Token ids drawn for prompts: above the tiny tokenizer's special tokens, below its vocabulary (4,096).
TOKEN_RANGE = (16, 4000)
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()  # fmt: skip


def block_tokens(hash_id: int) -> list[int]:
    """The 32 token ids standing for Mooncake hash id ``hash_id`` (deterministic)."""
    rng = random.Random(hash_id)
    return [rng.randrange(*TOKEN_RANGE) for _ in range(BLOCK_TOKENS)]


def block_text(hash_id: int) -> str:
    """A short deterministic text standing for ``hash_id`` in chat requests."""
    rng = random.Random(-1 - hash_id)
    return " ".join(rng.choice(WORDS) for _ in range(8)) + "."


@dataclass(slots=True)
class Spec:
    """One request to send: its index in the slice, kind, body and whether it is salted."""

    index: int
    kind: str  # "completion" or "chat"
    body: dict[str, Any]
    salted: bool = False

    @property
    def path(self) -> str:
        """The OpenAI endpoint."""
        return "/v1/completions" if self.kind == "completion" else "/v1/chat/completions"


def trace_slice(path: Path, count: int, max_prompt_tokens: int) -> tuple[list[list[int]], int]:
    """The hash ids of the first requests of a Mooncake trace whose prompt fits; returns them and the skipped count."""
    kept, skipped = [], 0
    with path.open() as lines:
        for line in lines:
            if len(kept) == count:
                break
            hash_ids = json.loads(line)["hash_ids"]
            if len(hash_ids) * BLOCK_TOKENS > max_prompt_tokens:
                skipped += 1
                continue
            kept.append(hash_ids)
    return kept, skipped


def specs(hash_lists: list[list[int]], max_tokens: int, chat_every: int, salt_every: int) -> list[Spec]:
    """Requests for ``hash_lists``: every ``chat_every``-th a chat, every ``salt_every``-th salted ("tenantA")."""
    out = []
    for i, hash_ids in enumerate(hash_lists):
        common = {"model": "tiny", "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True, "stream": True}
        common["stream_options"] = {"include_usage": True}
        if i % chat_every == chat_every - 1:
            text = " ".join(block_text(h) for h in hash_ids)
            body = {**common, "messages": [{"role": "user", "content": text}]}
            kind = "chat"
        else:
            body = {**common, "prompt": [t for h in hash_ids for t in block_tokens(h)]}
            kind = "completion"
        salted = i % salt_every == salt_every - 1
        if salted:
            body["cache_salt"] = "tenantA"
        out.append(Spec(i, kind, body, salted))
    return out


#: The load generator's timeout (seconds; httpx applies it to each read, so to a request's wait for its
#: first token too). OpenAI's SDK waits 600 s; the tests size their bursts to stay well under this instead.
CLIENT_TIMEOUT_S = 120.0


@dataclass(slots=True)
class Result:
    """What the client saw of one request."""

    spec: Spec
    status: int = 0
    worker: int | None = None
    decision: int | None = None
    error: str = ""
    usage: dict[str, Any] | None = None
    chunks: int = 0
    done: bool = False
    ttft_s: float | None = None
    #: Transport errors before any response header (the connection was reset); the request was then sent
    #: once more as ``<id>-resent``, as OpenAI's SDK does on a connection error.
    resets: list[str] = field(default_factory=list)

    @property
    def cached_tokens(self) -> int | None:
        """The engine's ``prompt_tokens_details.cached_tokens`` as the client received it."""
        details = (self.usage or {}).get("prompt_tokens_details") or {}
        return details.get("cached_tokens")


async def send(
    client: httpx.AsyncClient,
    base_url: str,
    spec: Spec,
    headers: dict[str, str],
    id_prefix: str = "e2e",
    live: list[Result] | None = None,
) -> Result:
    """Send one streamed request through the gateway (client id ``<id_prefix>-<index>``) and read the stream.

    ``live``, when given, receives the :class:`Result` at once, so a caller can watch the stream as it arrives.
    """
    result = Result(spec)
    if live is not None:
        live.append(result)
    for attempt in range(2):
        started = time.perf_counter()
        client_id = f"{id_prefix}-{spec.index}" + ("-resent" if attempt else "")
        request_headers = {"x-request-id": client_id, **headers}
        try:
            async with client.stream("POST", base_url + spec.path, json=spec.body, headers=request_headers) as response:
                result.status = response.status_code
                result.worker = _int_header(response, "x-kvcost-worker")
                result.decision = _int_header(response, "x-kvcost-decision")
                if response.status_code != 200:
                    result.error = (await response.aread()).decode(errors="replace")
                    return result
                async for line in response.aiter_lines():
                    _read_line(result, line, started)
            return result
        except httpx.TransportError as exc:
            result.error = f"{type(exc).__name__}: {exc}"
            if result.status or attempt:  # the answer had started: not resent (tokens may have been generated)
                return result
            result.resets.append(result.error)  # resent once, as OpenAI's SDK resends a connection error
        except httpx.HTTPError as exc:
            result.error = f"{type(exc).__name__}: {exc}"
            return result
        result.error = ""
    return result


def _read_line(result: Result, line: str, started: float) -> None:
    if not line.startswith("data: "):
        return
    data = line[6:]
    if data == "[DONE]":
        result.done = True
        return
    try:
        chunk = json.loads(data)
    except ValueError:  # a cut stream: counted as a failure of this request, not a crash of the harness
        result.error = f"malformed event after {result.chunks} chunks: {data[:120]!r}"
        return
    if "error" in chunk:
        result.error = chunk["error"].get("message", str(chunk["error"]))
    if chunk.get("choices"):
        result.chunks += 1
        if result.ttft_s is None:
            result.ttft_s = time.perf_counter() - started
    if chunk.get("usage"):
        result.usage = chunk["usage"]


def _int_header(response: httpx.Response, name: str) -> int | None:
    value = response.headers.get(name)
    return int(value) if value is not None and value.isdigit() else None


async def send_open_loop(
    base_url: str,
    all_specs: list[Spec],
    rate_per_s: float,
    headers: dict[str, str] | None = None,
    id_prefix="e2e",
    poisson_seed: int | None = None,
    live: list[Result] | None = None,
) -> list[Result]:
    """Send ``all_specs`` at ``rate_per_s`` (open loop: arrivals do not wait for answers).

    Arrivals are evenly spaced, or a Poisson process seeded by ``poisson_seed`` (exponential gaps of mean
    1 / ``rate_per_s``), as vLLM's ``benchmark_serving`` sends at a request rate: its bursts queue
    requests in every engine even when the router's split leaves one engine below its capacity on average.
    ``live``, when given, receives each request's :class:`Result` as it is sent (see :func:`send`).
    """
    offsets_s = [i / rate_per_s for i in range(len(all_specs))]
    if poisson_seed is not None:
        rng = random.Random(poisson_seed)
        offsets_s = list(itertools.accumulate((rng.expovariate(rate_per_s) for _ in all_specs[1:]), initial=0.0))
    limits = httpx.Limits(max_connections=None, keepalive_expiry=2.0)  # below the server's 5 s keep-alive
    async with httpx.AsyncClient(timeout=httpx.Timeout(CLIENT_TIMEOUT_S), limits=limits) as client:
        tasks = []
        start = time.perf_counter()
        for offset_s, spec in zip(offsets_s, all_specs, strict=True):
            delay = start + offset_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(client, base_url, spec, headers or {}, id_prefix, live)))
        return list(await asyncio.gather(*tasks))


async def measure_capacity_per_s(
    engine_urls: list[str], all_specs: list[Spec], per_engine_concurrency: int, warm_up: int
) -> float:
    """Requests per second the engines complete together in a closed loop, sent straight to them (no gateway).

    Each engine gets ``per_engine_concurrency`` senders that pull from one shared list of ``all_specs``
    (send them with their own ``cache_salt`` so they share no prefix with the traffic that follows),
    so both are busy until the list runs out. The first ``warm_up`` requests are sent the same way but
    not timed (a fresh engine's first requests are slower). Raises ``AssertionError`` when a request
    fails: a capacity measured on failures would be meaningless.
    """
    await _closed_loop(engine_urls, all_specs[:warm_up], per_engine_concurrency)
    start = time.perf_counter()
    done = await _closed_loop(engine_urls, all_specs[warm_up:], per_engine_concurrency)
    return done / (time.perf_counter() - start)


async def _closed_loop(engine_urls: list[str], all_specs: list[Spec], per_engine_concurrency: int) -> int:
    """Send ``all_specs`` straight to the engines, ``per_engine_concurrency`` at a time each; returns how many."""
    pending = list(reversed(all_specs))
    done = 0

    async def sender(client: httpx.AsyncClient, url: str) -> None:
        nonlocal done
        while pending:
            result = await send(client, url, pending.pop(), {}, id_prefix="calibration")
            assert result.status == 200 and result.done and not result.error, f"calibration request: {result}"
            done += 1

    async with httpx.AsyncClient(timeout=httpx.Timeout(CLIENT_TIMEOUT_S)) as client:
        await asyncio.gather(*(sender(client, u) for u in engine_urls for _ in range(per_engine_concurrency)))
    return done


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels`` in a Prometheus text."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total
