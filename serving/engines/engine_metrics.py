"""Worker snapshots from the engines' Prometheus ``/metrics`` (docs/architecture.md §7, "vLLM metrics").

``kvcost serve --scrape W=http://HOST:PORT/metrics`` scrapes each engine every
``--scrape-interval-s`` and stores what it reads as worker ``W``'s snapshot,
exactly as ``POST /v1/workers/W/snapshot`` would (a later push or scrape
replaces it). A failed scrape is counted (``kvcost_engine_scrapes_total`` by
``result``) and logged; the worker keeps its previous snapshot, whose age
(``kvcost_snapshot_age_seconds``, ``snapshot_age_s`` in every score) keeps
growing, so an old snapshot is visible as old.

Metric names read (sample names as exposed; counters end in ``_total``). vLLM:
``vllm/v1/metrics/loggers.py``; SGLang: ``python/sglang/srt/metrics/collector.py``
(its ``sglang_`` prefix is read as ``sglang:`` too).

- ``running_requests``: ``vllm:num_requests_running``; ``sglang:num_running_reqs``.
- waiting requests: ``vllm:num_requests_waiting``; ``sglang:num_queue_reqs``.
- ``kv_usage``: ``vllm:kv_cache_usage_perc`` (a ratio in [0, 1] despite the name;
  ``vllm:gpu_cache_usage_perc`` before 0.10); ``sglang:token_usage``.
- ``kv_capacity_blocks``: label ``num_gpu_blocks`` of ``vllm:cache_config_info``
  (whose ``block_size`` is read too); SGLang: 0 (unknown).
- mean prompt tokens: ``vllm:request_prompt_tokens_sum`` / ``_count``;
  ``sglang:prompt_tokens_total`` / ``sglang:num_requests_total``.
- ``recent_step_s``: mean inter-token latency, ``vllm:inter_token_latency_seconds_sum``
  / ``_count`` (``vllm:time_per_output_token_seconds`` before 0.11);
  ``sglang:inter_token_latency_seconds_sum`` / ``_count``.
- ``decode_context_tokens``: vLLM ``kv_usage × num_gpu_blocks × block_size`` (an
  upper bound: prefill chunks hold KV too); ``sglang:decode_sum_seq_lens``.
- prefix-cache token hit ratio (no snapshot field; exported as
  ``kvcost_engine_prefix_cache_hit_ratio``): ``vllm:prefix_cache_hits_total`` /
  ``vllm:prefix_cache_queries_total`` over the interval (``vllm:gpu_prefix_cache_*``
  before 0.10); ``sglang:cache_hit_rate``.

A metrics endpoint does not list the waiting requests' lengths, so each
waiting request is taken to need the mean prompt length of prefill
(``waiting_prefill = [(mean_prompt_tokens, 0)] × waiting``, and
``waiting_prompt_blocks`` accordingly); means and the step time are taken over
the interval since the previous scrape when requests finished in it, else
since the engine started. Fields no metric gives stay 0 (unknown):
``idle_cached_blocks``, ``step_remaining_s``, ``oldest_waiting_s``,
``recent_step_nominal_s``. Series of one name with different labels (data
parallel engines, several models) are summed; ratios are averaged.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvcost.serving.metrics import ServiceMetrics
from kvcost.serving.schemas import MAX_COUNT, MAX_SECONDS, MAX_TOKENS, MAX_WAITING_REQUESTS, SnapshotIn

logger = logging.getLogger(__name__)

#: Sample names per quantity and engine, first found wins (newest name first).
_VLLM = {
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "prompt_sum": ("vllm:request_prompt_tokens_sum",),
    "prompt_count": ("vllm:request_prompt_tokens_count",),
    "step_sum": ("vllm:inter_token_latency_seconds_sum", "vllm:time_per_output_token_seconds_sum"),
    "step_count": ("vllm:inter_token_latency_seconds_count", "vllm:time_per_output_token_seconds_count"),
    "cache_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "cache_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
}
_SGLANG = {
    "running": ("sglang:num_running_reqs",),
    "waiting": ("sglang:num_queue_reqs",),
    "kv_usage": ("sglang:token_usage",),
    "prompt_sum": ("sglang:prompt_tokens_total",),
    "prompt_count": ("sglang:num_requests_total",),
    "step_sum": ("sglang:inter_token_latency_seconds_sum",),
    "step_count": ("sglang:inter_token_latency_seconds_count",),
    "decode_context": ("sglang:decode_sum_seq_lens",),
    "hit_ratio": ("sglang:cache_hit_rate",),
}
_VLLM_CACHE_CONFIG = "vllm:cache_config_info"
#: ``result`` label values of ``kvcost_engine_scrapes_total``.
SCRAPE_RESULTS = ("ok", "timeout", "unreachable", "http_error", "parse_error", "rejected")


class EngineMetricsError(ValueError):
    """A scraped text that is not Prometheus exposition, or holds no vLLM / SGLang load metrics."""


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """One scrape of one engine's ``/metrics``, cumulative counters as read.

    Attributes:
        engine: ``"vllm"`` or ``"sglang"``.
        running_requests: requests running (decode or prefill in progress).
        waiting_requests: requests queued, not yet scheduled.
        kv_usage: KV cache in use, ratio in [0, 1].
        kv_capacity_blocks: KV blocks of the engine (vLLM ``num_gpu_blocks``); 0 = unknown.
        block_size_tokens: tokens per KV block (vLLM ``block_size``); 0 = unknown.
        prompt_tokens_sum: prompt tokens of the requests counted in ``prompt_requests``.
        prompt_requests: requests whose prompt length is summed.
        step_s_sum: inter-token latencies summed, seconds.
        step_count: inter-token latencies counted.
        prefix_cache_queries_tokens: tokens looked up in the prefix cache (vLLM), cumulative.
        prefix_cache_hits_tokens: of those, tokens found (vLLM), cumulative.
        prefix_cache_hit_ratio: the engine's own hit ratio gauge (SGLang); None when not exposed.
        decode_context_tokens: sum of the decoding requests' lengths (SGLang); None when not exposed.
        process_start_time_s: the engine process's start, epoch seconds (``process_start_time_seconds``
            of prometheus-client's process collector, which vLLM and SGLang expose on Linux); None
            when not exposed. A new value means a new process (an empty prefix cache).
    """

    engine: str
    running_requests: float = 0.0
    waiting_requests: float = 0.0
    kv_usage: float = 0.0
    kv_capacity_blocks: int = 0
    block_size_tokens: int = 0
    prompt_tokens_sum: float = 0.0
    prompt_requests: float = 0.0
    step_s_sum: float = 0.0
    step_count: float = 0.0
    prefix_cache_queries_tokens: float = 0.0
    prefix_cache_hits_tokens: float = 0.0
    prefix_cache_hit_ratio: float | None = None
    decode_context_tokens: float | None = None
    process_start_time_s: float | None = None


#: Every sample name read (``sglang_`` spellings included): the only lines handed to the parser.
_WANTED = frozenset(
    {n for table in (_VLLM, _SGLANG) for names in table.values() for n in names}
    | {n.replace("sglang:", "sglang_") for names in _SGLANG.values() for n in names}
    | {_VLLM_CACHE_CONFIG, "process_start_time_seconds"}
)


def wanted_lines(text: str) -> str:
    """The sample lines of the names read, and any line that is neither a comment nor a ``name{…} value``
    sample (so that a text that is not exposition is still refused). A vLLM ``/metrics`` is thousands of
    lines, mostly histogram buckets; prometheus-client's parser reads them character by character on the
    event loop (about 10 % of a gateway's CPU at 20 requests/s), which this filter avoids."""
    kept = []
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in _WANTED or not _METRIC_NAME.fullmatch(name):
            kept.append(line)
    return "\n".join(kept) + "\n"


_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _samples(text: str) -> dict[str, list[tuple[Mapping[str, str], float]]]:
    samples: dict[str, list[tuple[Mapping[str, str], float]]] = {}
    try:
        for family in text_string_to_metric_families(wanted_lines(text)):
            for sample in family.samples:
                name = sample.name
                if name.startswith("sglang_"):  # SGLang releases that dropped the colon
                    name = "sglang:" + name[len("sglang_") :]
                samples.setdefault(name, []).append((sample.labels, float(sample.value)))
    except (ValueError, TypeError, IndexError, KeyError) as err:  # the parser's ways of refusing a line
        raise EngineMetricsError(f"not Prometheus text exposition: {err}") from None
    return samples


def _finite(values: Iterable[float]) -> list[float]:
    return [v for v in values if math.isfinite(v)]


def parse_engine_metrics(text: str) -> EngineMetrics:
    """Read the load metrics of a vLLM or SGLang ``/metrics`` text (see the module table).

    Series of one name are summed (counts) or averaged (ratios); non-finite values are ignored.

    Raises:
        EngineMetricsError: the text is not Prometheus exposition, or has neither
            ``vllm:num_requests_running`` nor ``sglang:num_running_reqs``.
    """
    samples = _samples(text)
    if "vllm:num_requests_running" in samples:
        engine, names = "vllm", _VLLM
    elif "sglang:num_running_reqs" in samples:
        engine, names = "sglang", _SGLANG
    else:
        raise EngineMetricsError(
            "no vLLM or SGLang load metrics (vllm:num_requests_running, sglang:num_running_reqs) in the text"
        )

    def values(key: str) -> list[float] | None:
        for name in names.get(key, ()):
            if name in samples:
                return _finite(v for _, v in samples[name])
        return None

    def total(key: str) -> float:
        found = values(key)
        return float(sum(found)) if found else 0.0

    def mean(key: str) -> float | None:
        found = values(key)
        return sum(found) / len(found) if found else None

    capacity = block_size = 0
    for labels, _ in samples.get(_VLLM_CACHE_CONFIG, ()):
        capacity += _int_label(labels, "num_gpu_blocks")
        block_size = block_size or _int_label(labels, "block_size")
    decode = values("decode_context")
    started = _finite(v for _, v in samples.get("process_start_time_seconds", ()))
    return EngineMetrics(
        engine=engine,
        running_requests=total("running"),
        waiting_requests=total("waiting"),
        kv_usage=min(1.0, max(0.0, mean("kv_usage") or 0.0)),
        kv_capacity_blocks=capacity,
        block_size_tokens=block_size,
        prompt_tokens_sum=total("prompt_sum"),
        prompt_requests=total("prompt_count"),
        step_s_sum=total("step_sum"),
        step_count=total("step_count"),
        prefix_cache_queries_tokens=total("cache_queries"),
        prefix_cache_hits_tokens=total("cache_hits"),
        prefix_cache_hit_ratio=mean("hit_ratio"),
        decode_context_tokens=float(sum(decode)) if decode else None,
        process_start_time_s=max(started) if started else None,
    )


def _int_label(labels: Mapping[str, str], name: str) -> int:
    try:
        return max(0, int(labels.get(name, "")))
    except ValueError:  # vLLM writes "None" for a value not known yet
        return 0


def _interval_mean(total_now: float, count_now: float, total_before: float, count_before: float) -> float:
    """Mean over the interval when it counted anything, else over the whole history; 0 when nothing counted."""
    if count_now > count_before and total_now >= total_before:
        return (total_now - total_before) / (count_now - count_before)
    return total_now / count_now if count_now > 0 else 0.0


def _count(value: float) -> int:
    return min(MAX_COUNT, max(0, round(value)))


def snapshot_from_metrics(current: EngineMetrics, previous: EngineMetrics | None = None) -> SnapshotIn:
    """The worker snapshot ``current`` stands for (see the module docstring for each field's source).

    Args:
        current: this scrape.
        previous: the worker's previous successful scrape, for means over the interval; None at the first.

    Returns:
        A :class:`SnapshotIn` with ``gpu`` unset (the service's default GPU type).
    """
    before = previous if previous is not None and previous.engine == current.engine else None
    prompt_tokens = _interval_mean(
        current.prompt_tokens_sum,
        current.prompt_requests,
        before.prompt_tokens_sum if before else 0.0,
        before.prompt_requests if before else 0.0,
    )
    step_s = _interval_mean(
        current.step_s_sum,
        current.step_count,
        before.step_s_sum if before else 0.0,
        before.step_count if before else 0.0,
    )
    waiting = min(MAX_WAITING_REQUESTS, _count(current.waiting_requests))
    mean_prompt = _count(prompt_tokens)
    block = current.block_size_tokens
    if current.decode_context_tokens is not None:
        decode_context = _count(current.decode_context_tokens)
    else:
        decode_context = _count(current.kv_usage * current.kv_capacity_blocks * block)
    return SnapshotIn(
        waiting_prefill=[(min(mean_prompt, MAX_TOKENS), 0)] * waiting,
        running_requests=_count(current.running_requests),
        decode_context_tokens=decode_context,
        kv_usage=current.kv_usage,
        recent_step_s=min(MAX_SECONDS, max(0.0, step_s)),
        kv_capacity_blocks=_count(current.kv_capacity_blocks),
        waiting_prompt_blocks=_count(waiting * math.ceil(mean_prompt / block)) if block else 0,
    )


def prefix_cache_hit_ratio(current: EngineMetrics, previous: EngineMetrics | None = None) -> float | None:
    """Token hit ratio of the prefix cache in [0, 1]: over the interval (vLLM counters) or the engine's gauge (SGLang).

    Returns:
        None when the engine exposes neither, or looked nothing up.
    """
    if current.prefix_cache_hit_ratio is not None:
        return min(1.0, max(0.0, current.prefix_cache_hit_ratio))
    queries, hits = current.prefix_cache_queries_tokens, current.prefix_cache_hits_tokens
    if previous is not None and queries > previous.prefix_cache_queries_tokens:
        queries -= previous.prefix_cache_queries_tokens
        hits -= previous.prefix_cache_hits_tokens
    return min(1.0, max(0.0, hits / queries)) if queries > 0 else None


@dataclass(frozen=True, slots=True)
class ScrapeTarget:
    """One engine to scrape: the worker it is and its metrics URL (``http://HOST:PORT/metrics``)."""

    worker_id: int
    url: str


def parse_scrape_target(spec: str) -> ScrapeTarget:
    """Parse ``WORKER=http://HOST:PORT/metrics``.

    Raises:
        ValueError: naming the value and the expected form.
    """
    worker, sep, url = spec.partition("=")
    if not sep or not worker.strip().isdigit() or not url.startswith(("http://", "https://")):
        raise ValueError(
            f"scrape entry {spec!r}, expected WORKER=http://HOST:PORT/metrics such as '0=http://10.0.0.5:8000/metrics'"
        )
    return ScrapeTarget(int(worker), url)


#: Errors of a kept-alive connection the engine closed while it sat in the pool: the GET never reached
#: a live handler, so it is sent once more on a new connection before the engine counts as unreachable.
#: A refused connection (``ConnectError``) and a timeout are not retried: nothing is listening, or it is slow.
STALE_CONNECTION_ERRORS = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


async def _get_once_more_if_stale(client: httpx.AsyncClient, url: str) -> httpx.Response:
    """``GET url``, retried once on :data:`STALE_CONNECTION_ERRORS` (the second failure is raised).

    An HTTP server closes an idle kept-alive connection after its keep-alive timeout (uvicorn's, which
    vLLM and SGLang serve with, is 5 s). A request sent on it as the server closes it fails with
    "Server disconnected without sending a response". That happens when the router's event loop stalls
    near the timeout on a loaded machine, and says nothing about the engine. A GET is idempotent, and
    HTTP/1.1 lets a client retry an idempotent request after its connection closed (RFC 9110 §9.2.2,
    RFC 9112 §9.3.1). The gateway's POSTs to the engines follow the same rule with aiohttp
    (:func:`kvcost.serving.gateway.engine_http.post`: only a reused connection, sent again on a new one).

    Raises:
        httpx.HTTPError: the second attempt's error, or the first one's when it is not a stale connection.
    """
    try:
        return await client.get(url)
    except STALE_CONNECTION_ERRORS:
        return await client.get(url)


@dataclass(slots=True)
class _WorkerState:
    last: EngineMetrics | None = None
    failures_in_row: int = 0
    results: dict[str, int] = field(default_factory=dict)


class EngineMetricsScraper:
    """Scrapes every target's ``/metrics`` each ``interval_s`` and pushes the snapshots (an asyncio task).

    Args:
        targets: the engines, one per worker id.
        push: stores a worker's snapshot (:meth:`ScoringService.push_snapshot`); any exception it
            raises counts as result ``rejected``.
        metrics: the service's metrics (scrape results, consecutive failures, prefix-cache hit ratio).
        interval_s: time between the starts of two scrapes of all targets, seconds (> 0).
        timeout_s: limit of one HTTP request (connect, read, whole), seconds (> 0).
        transport: httpx transport (tests); None = the network.
        on_scrape: called on the event loop after each scrape of a worker with ``(worker_id,
            metrics)``: what was read, or None when the engine did not answer (timeout,
            unreachable, HTTP error); a text that does not parse is not reported (the engine
            answered). :class:`~kvcost.serving.engines.liveness.EngineLiveness` uses it.

    A scrape's text is parsed in a worker thread (a vLLM ``/metrics`` of a few hundred
    kilobytes takes milliseconds to parse, which the event loop must not wait for);
    the snapshot is pushed on the event loop, as an HTTP push would be.

    Thread safety: call :meth:`start`, :meth:`scrape_once` and :meth:`stop` from the service's event loop.
    """

    def __init__(
        self,
        targets: Sequence[ScrapeTarget],
        push: Callable[[int, SnapshotIn], object],
        metrics: ServiceMetrics,
        interval_s: float = 1.0,
        timeout_s: float = 1.0,
        transport: httpx.AsyncBaseTransport | None = None,
        on_scrape: Callable[[int, EngineMetrics | None], object] | None = None,
    ) -> None:
        if not targets:
            raise ValueError("targets is empty, expected at least one ScrapeTarget")
        workers = [t.worker_id for t in targets]
        if len(set(workers)) != len(workers):
            raise ValueError(f"scrape targets name worker ids {workers}; each worker may be scraped once")
        if not interval_s > 0 or not timeout_s > 0:
            raise ValueError(f"interval_s = {interval_s}, timeout_s = {timeout_s}, expected both > 0")
        self.targets = tuple(targets)
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._push = push
        self._metrics = metrics
        self._transport = transport
        self._on_scrape = on_scrape
        self._state = {t.worker_id: _WorkerState() for t in targets}
        self._client: httpx.AsyncClient | None = None
        self._task: asyncio.Task | None = None
        for target in targets:
            label = str(target.worker_id)
            for result in SCRAPE_RESULTS:
                metrics.engine_scrapes.labels(label, result)
            metrics.engine_scrape_failures_in_row.labels(label).set(0)

    def results(self, worker_id: int) -> dict[str, int]:
        """Scrapes of ``worker_id`` so far, by result (a copy)."""
        return dict(self._state[worker_id].results)

    def start(self) -> None:
        """Open the HTTP client and start scraping (the first scrape starts at once)."""
        if self._task is not None:
            raise RuntimeError("EngineMetricsScraper already started")
        self._client = self._new_client()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="kvcost-engine-scraper")

    async def stop(self) -> None:
        """Cancel the scraping task and close the client (idempotent)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _new_client(self) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=len(self.targets), max_keepalive_connections=len(self.targets))
        return httpx.AsyncClient(timeout=self.timeout_s, limits=limits, transport=self._transport)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                await self.scrape_once()
            except Exception:  # the loop must outlive any one round
                logger.exception("engine metrics scrape round failed")
            await asyncio.sleep(max(0.0, started + self.interval_s - loop.time()))

    async def scrape_once(self) -> dict[int, str]:
        """Scrape every target once, concurrently; push each snapshot read. Returns worker id → result."""
        own = self._client is None
        client = self._client or self._new_client()
        try:
            results = await asyncio.gather(*(self._scrape(client, t) for t in self.targets))
        finally:
            if own:
                await client.aclose()
        return {t.worker_id: r for t, r in zip(self.targets, results, strict=True)}

    async def _scrape(self, client: httpx.AsyncClient, target: ScrapeTarget) -> str:
        state = self._state[target.worker_id]
        try:
            response = await _get_once_more_if_stale(client, target.url)
            response.raise_for_status()
            current = await asyncio.to_thread(parse_engine_metrics, response.text)
        except httpx.TimeoutException as err:
            self._report(target, None)
            return self._failed(
                target, state, "timeout", f"no answer within {self.timeout_s:g} s ({type(err).__name__})"
            )
        except httpx.HTTPStatusError as err:
            self._report(target, None)
            return self._failed(target, state, "http_error", f"HTTP {err.response.status_code}")
        except httpx.HTTPError as err:
            self._report(target, None)
            return self._failed(target, state, "unreachable", f"{type(err).__name__}: {err}")
        except EngineMetricsError as err:
            return self._failed(target, state, "parse_error", str(err))
        self._report(target, current)
        try:
            self._push(target.worker_id, snapshot_from_metrics(current, state.last))
        except Exception as err:  # a snapshot the service refuses (e.g. max_workers) must not stop scraping
            return self._failed(target, state, "rejected", f"snapshot refused: {err}")
        ratio = prefix_cache_hit_ratio(current, state.last)
        if ratio is not None:
            self._metrics.engine_prefix_cache_hit_ratio.labels(str(target.worker_id)).set(ratio)
        state.last = current
        state.failures_in_row = 0
        self._count(target, state, "ok")
        return "ok"

    def _report(self, target: ScrapeTarget, current: EngineMetrics | None) -> None:
        if self._on_scrape is None:
            return
        try:
            self._on_scrape(target.worker_id, current)
        except Exception:  # the hook must not stop scraping
            logger.exception("worker %d: on_scrape hook failed", target.worker_id)

    def _failed(self, target: ScrapeTarget, state: _WorkerState, result: str, reason: str) -> str:
        state.failures_in_row += 1
        self._count(target, state, result)
        n = state.failures_in_row
        level = logging.WARNING if n & (n - 1) == 0 else logging.DEBUG  # 1st, 2nd, 4th … failure in a row
        logger.log(
            level, "worker %d: scrape of %s failed (%s): %s; %d in a row, its snapshot ages",
            target.worker_id, target.url, result, reason, n,
        )  # fmt: skip
        return result

    def _count(self, target: ScrapeTarget, state: _WorkerState, result: str) -> None:
        state.results[result] = state.results.get(result, 0) + 1
        label = str(target.worker_id)
        self._metrics.engine_scrapes.labels(label, result).inc()
        self._metrics.engine_scrape_failures_in_row.labels(label).set(state.failures_in_row)
