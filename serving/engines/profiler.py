"""``kvcost profile``: measure a live OpenAI-compatible engine's prefill and decode step times.

* **Round trip**: the median of ``GET /health`` (vLLM, SGLang) or ``GET /v1/models`` timings, the
  network and HTTP cost subtracted from every prefill time.
* **Prefill**: one request at a time (no queue), ``max_tokens`` 1, a prompt of ``L`` token ids drawn
  at random (so the prefix cache holds none of it), for each ``L`` of ``prompt_tokens``; one
  unmeasured request first, then the median over ``repeats`` of wall time − round trip. The first
  token comes at the end of the prefill step, so this is one prefill of ``L`` tokens from scratch.
* **Decode**: ``B`` concurrent streams of a short random prompt with ``max_tokens`` ``decode_tokens``
  and ``ignore_eos`` (vLLM and SGLang both honour it), for each ``B`` of ``batches``, run
  ``repeats // 2 + 1`` times (the median kept); the step time of a run is the median over the
  streams of each one's time per output token after its first (the span from
  its first to its last streamed event over its token count: an HTTP read may carry several events,
  so single gaps between them mean nothing).

Where the engine reports its own timers (vLLM's ``request_prefill_time_seconds`` and
``inter_token_latency_seconds``), they are used instead of the client's clock (per request for a
prefill, read before and after it; the mean over a decode run): they leave out the HTTP server
and the client, which share the CPUs with the engine on a small machine and are what varies most
there. Measured on the 2-core machine against the tiny CPU engine, the client's clock put 2–5 ms
of HTTP and tokenization on every prefill (5.6 against 3.0 ms at 16 tokens).

The points are fitted by :func:`~kvcost.core.engine_profile.fit_engine_profile`, every third point
of each series held back to measure the fit.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx
import numpy as np

from kvcost.core.engine_profile import EngineProfile, fit_engine_profile, relative_errors
from kvcost.core.specs import resolve_model
from kvcost.serving.engines.engine_metrics import EngineMetricsError, parse_engine_metrics

#: Token ids the random prompts draw from start here (below: special and control tokens in most vocabularies).
FIRST_PROMPT_TOKEN_ID = 100

#: vLLM's engine-side timers (``vllm/v1/metrics/loggers.py``): sample name → key.
_ENGINE_TIMERS = {
    "vllm:request_prefill_time_seconds_sum": "prefill_sum",
    "vllm:request_prefill_time_seconds_count": "prefill_count",
    "vllm:inter_token_latency_seconds_sum": "step_sum",
    "vllm:inter_token_latency_seconds_count": "step_count",
}


@dataclass(frozen=True)
class ProfilePlan:
    """What to measure.

    Attributes:
        prompt_tokens: prefill lengths, each ≥ 1.
        batches: decode batch sizes, each ≥ 1.
        repeats: requests per prefill length (≥ 1; the median is kept).
        decode_tokens: output tokens of each decode stream (≥ 8).
        decode_prompt_tokens: prompt of each decode stream (≥ 1).
        token_budget: the engine's tokens per step, recorded in the profile.
    """

    prompt_tokens: tuple[int, ...] = (16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536)
    batches: tuple[int, ...] = (1, 2, 4, 8, 12, 16, 24, 32)
    repeats: int = 5
    decode_tokens: int = 48
    decode_prompt_tokens: int = 32
    token_budget: int = 8192

    def __post_init__(self) -> None:
        for name, values in (("prompt_tokens", self.prompt_tokens), ("batches", self.batches)):
            if not values or min(values) < 1:
                raise ValueError(f"{name} = {list(values)}, expected a non-empty list of integers ≥ 1")
        for name, value, low in (("repeats", self.repeats, 1), ("decode_tokens", self.decode_tokens, 8),
                                 ("decode_prompt_tokens", self.decode_prompt_tokens, 1)):  # fmt: skip
            if value < low:
                raise ValueError(f"{name} = {value}, expected an integer ≥ {low}")


class EngineProfiler:
    """Measures one engine at ``base_url`` serving ``model`` (name or ``config.json``; its vocabulary
    bounds the random prompts); ``seed`` fixes the prompts."""

    def __init__(self, base_url: str, model: str, seed: int = 0, timeout_s: float = 120.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        vocab = resolve_model(model).vocab_size or 32000
        self._high_id = max(FIRST_PROMPT_TOKEN_ID + 1, vocab - 1)
        self._rng = random.Random(seed)
        self._timeout = httpx.Timeout(timeout_s)
        self._served: str | None = None

    def _prompt(self, tokens: int) -> list[int]:
        return [self._rng.randrange(FIRST_PROMPT_TOKEN_ID, self._high_id) for _ in range(tokens)]

    def served_model(self, client: httpx.Client) -> str:
        """The engine's first model id (``GET /v1/models``)."""
        if self._served is None:
            response = client.get(f"{self.base_url}/v1/models")
            response.raise_for_status()
            self._served = response.json()["data"][0]["id"]
        return self._served

    def round_trip_s(self, client: httpx.Client, samples: int = 20) -> float:
        """Median seconds of a trivial request (``/health``, else ``/v1/models``)."""
        path = "/health" if client.get(f"{self.base_url}/health").status_code == 200 else "/v1/models"
        times = []
        for _ in range(samples):
            start = time.perf_counter()
            client.get(f"{self.base_url}{path}").raise_for_status()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    def prefill_s(self, client: httpx.Client, prompt_tokens: int, repeats: int, rtt_s: float) -> float:
        """Seconds of a prefill of ``prompt_tokens`` fresh tokens: the median over ``repeats`` requests
        (after one unmeasured request of that length: an engine may compile or tune a kernel on a
        shape it has not run yet) of the engine's own prefill time where it reports one, else of
        the wall time less ``rtt_s``."""
        body = {"model": self.served_model(client), "max_tokens": 1, "temperature": 0.0}
        url = f"{self.base_url}/v1/completions"
        client.post(url, json=body | {"prompt": self._prompt(prompt_tokens)}).raise_for_status()
        engine, wall = [], []
        for _ in range(repeats):
            before = self.engine_timers(client)
            start = time.perf_counter()
            client.post(url, json=body | {"prompt": self._prompt(prompt_tokens)}).raise_for_status()
            wall.append(time.perf_counter() - start - rtt_s)
            after = self.engine_timers(client) if before is not None else None
            if after is not None and after["prefill_count"] == before["prefill_count"] + 1:
                engine.append(after["prefill_sum"] - before["prefill_sum"])
        return statistics.median(engine if len(engine) == repeats else wall)

    async def _stream_step_s(self, client: httpx.AsyncClient, body: dict) -> float:
        """Seconds per output token of one stream after its first: (last event − first event) ÷
        (tokens − 1). Events are timed as read, and an HTTP read may carry several, so single gaps
        mean nothing; the span over the whole stream does."""
        arrivals, tokens = [], 0
        async with client.stream("POST", f"{self.base_url}/v1/completions", json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                event = json.loads(line[5:])
                if event.get("choices"):
                    arrivals.append(time.perf_counter())
                tokens = (event.get("usage") or {}).get("completion_tokens", tokens)
        if tokens < 2 or len(arrivals) < 2:
            raise ValueError(f"engine = {self.base_url!r}: a stream returned {tokens} tokens, expected ≥ 2")
        return (arrivals[-1] - arrivals[0]) / (tokens - 1)

    async def _decode_step_s(self, batch: int, decode_tokens: int, prompt_tokens: int) -> float:
        body = {"model": self._served, "max_tokens": decode_tokens, "temperature": 0.0, "stream": True,
                "ignore_eos": True, "stream_options": {"include_usage": True}}  # fmt: skip
        limits = httpx.Limits(max_connections=batch + 4)
        async with httpx.AsyncClient(timeout=self._timeout, limits=limits) as client:
            steps = await asyncio.gather(
                *(self._stream_step_s(client, body | {"prompt": self._prompt(prompt_tokens)}) for _ in range(batch))
            )
        return statistics.median(steps)

    def decode_step_s(
        self, client: httpx.Client, batch: int, decode_tokens: int, prompt_tokens: int, repeats: int = 3
    ) -> float:
        """Seconds of a decode step of ``batch`` streams: the median over ``repeats`` runs of the engine's
        mean inter-token latency over the run where it reports one, else of the client's timing."""
        steps = []
        for _ in range(repeats):
            before = self.engine_timers(client)
            client_s = asyncio.run(self._decode_step_s(batch, decode_tokens, prompt_tokens))
            after = self.engine_timers(client) if before is not None else None
            if after is not None and after["step_count"] > before["step_count"]:
                client_s = (after["step_sum"] - before["step_sum"]) / (after["step_count"] - before["step_count"])
            steps.append(client_s)
        return statistics.median(steps)

    def engine_timers(self, client: httpx.Client) -> dict[str, float] | None:
        """The engine's own cumulative timers, ``{"prefill_sum", "prefill_count", "step_sum", "step_count"}``
        (vLLM's ``request_prefill_time_seconds`` and ``inter_token_latency_seconds`` histograms), or
        None when it exposes neither (the client's timing is used then)."""
        response = client.get(f"{self.base_url}/metrics")
        if response.status_code != 200:
            return None
        from prometheus_client.parser import text_string_to_metric_families

        totals = dict.fromkeys(_ENGINE_TIMERS.values(), 0.0)
        for family in text_string_to_metric_families(response.text):
            for sample in family.samples:
                if sample.name in _ENGINE_TIMERS:
                    totals[_ENGINE_TIMERS[sample.name]] += sample.value
        return totals if totals["prefill_count"] and totals["step_count"] else None

    def kv_cache(self, client: httpx.Client) -> tuple[int, int]:
        """``(kv_capacity_blocks, block_size_tokens)`` from the engine's ``/metrics`` (vLLM's
        ``cache_config_info``); (0, 0) when not exposed."""
        response = client.get(f"{self.base_url}/metrics")
        if response.status_code != 200:
            return 0, 0
        try:
            metrics = parse_engine_metrics(response.text)
        except EngineMetricsError:
            return 0, 0
        return metrics.kv_capacity_blocks, metrics.block_size_tokens

    def measure(self, name: str, plan: ProfilePlan, progress=None) -> EngineProfile:
        """Measure every point of ``plan``, fit, and return the profile named ``name``.

        Raises:
            httpx.HTTPError: the engine failed a request.
            ValueError: the fit failed (too few points, or a round trip longer than a request).
        """
        started = time.perf_counter()
        with httpx.Client(timeout=self._timeout) as client:
            self.served_model(client)
            rtt_s = self.round_trip_s(client)
            blocks, block_size = self.kv_cache(client)
            prefill = []
            for length in plan.prompt_tokens:
                prefill.append([length, self.prefill_s(client, length, plan.repeats, rtt_s)])
                if progress:
                    progress(f"prefill {length} tokens: {prefill[-1][1] * 1e3:.1f} ms")
            context = plan.decode_prompt_tokens + plan.decode_tokens / 2
            decode = []
            for batch in plan.batches:
                step_s = self.decode_step_s(
                    client, batch, plan.decode_tokens, plan.decode_prompt_tokens, max(1, plan.repeats // 2 + 1)
                )
                decode.append([batch, context, step_s])
                if progress:
                    progress(f"decode batch {batch}: {step_s * 1e3:.2f} ms a step")
        return _fitted(name, self, rtt_s, prefill, decode, plan, (blocks, block_size), time.perf_counter() - started)


def held_out(points: Sequence) -> np.ndarray:
    """Every third point (1-based: the 2nd, 5th, 8th …) is held back from the fit."""
    return np.arange(len(points)) % 3 == 1


def _fitted(name, profiler, rtt_s, prefill, decode, plan, kv, wall_s) -> EngineProfile:
    prefill_a, decode_a = np.array(prefill, dtype=np.float64), np.array(decode, dtype=np.float64)
    hold_p, hold_d = held_out(prefill), held_out(decode)
    fit = fit_engine_profile(prefill_a[~hold_p], decode_a[~hold_d])
    p_err, d_err = relative_errors(fit, prefill_a[hold_p], decode_a[hold_d])
    errors = {
        "prefill_median": float(np.median(p_err)) if len(p_err) else float("nan"),
        "prefill_max": float(p_err.max()) if len(p_err) else float("nan"),
        "decode_median": float(np.median(d_err)) if len(d_err) else float("nan"),
        "decode_max": float(d_err.max()) if len(d_err) else float("nan"),
    }
    return EngineProfile(
        name=name,
        model=profiler.model,
        engine_url=profiler.base_url,
        rtt_s=rtt_s,
        prefill=[[*p, bool(h)] for p, h in zip(prefill, hold_p, strict=True)],
        decode=[[*d, bool(h)] for d, h in zip(decode, hold_d, strict=True)],
        fit=fit,
        token_budget=plan.token_budget,
        kv_capacity_blocks=kv[0],
        block_size_tokens=kv[1],
        held_out_errors=errors,
        wall_s=wall_s,
    )
