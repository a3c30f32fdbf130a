"""A null engine: vLLM's HTTP surface with no model behind it, to isolate the gateway's own cost.

``tests.e2e.overhead --engine null`` puts the gateway in front of this server instead of a
real vLLM engine. On the 2-core machine a real engine takes 1.5 cores at 20 requests/s and is
saturated at 50 requests/s, so what the gateway adds there is mostly CPU contention
(``docs/gateway.md``, "The gateway's cost"). This server answers at once, so the added TTFT
measured through it is the gateway's own: its parsing, tokenizing, routing, logging and the
extra hop. It is a measuring instrument, not a stand-in for the engine in the tests: every
end-to-end test runs against real vLLM.

What it serves, in vLLM 0.32's shapes:

* ``POST /v1/completions``: streamed (SSE) or not. ``max_tokens`` chunks of one token each,
  sent as fast as the server can write them, then ``[DONE]``; with
  ``stream_options.include_usage`` a last chunk with ``usage`` (``prompt_tokens`` is the prompt's
  token count when the prompt is a list of ids, else its whitespace-split words;
  ``prompt_tokens_details.cached_tokens`` 0).
* ``GET /v1/models``, ``GET /health``, and ``GET /metrics`` with the gauges and counters
  kvcost scrapes (:mod:`kvcost.serving.engines.engine_metrics`): nothing running or waiting,
  KV usage 0, ``num_gpu_blocks`` :data:`NUM_GPU_BLOCKS`.

Run: ``.venv/bin/python -m uvicorn tests.e2e.null_engine:app --port P`` (or :class:`NullEngine`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

#: The model name it answers to (the e2e tests' ``--served-model-name``).
MODEL = "tiny"
#: KV blocks it reports (``vllm:cache_config_info``'s ``num_gpu_blocks``).
NUM_GPU_BLOCKS = 2000

_METRICS = f"""# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="{MODEL}"}} 0.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{model_name="{MODEL}"}} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{model_name="{MODEL}"}} 0.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="32",num_gpu_blocks="{NUM_GPU_BLOCKS}"}} 1.0
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{model_name="{MODEL}"}} 0.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{{model_name="{MODEL}"}} 0.0
"""


def _prompt_tokens(prompt: object) -> int:
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    return len(str(prompt).split())


def _chunk(request_id: str, created: int, text: str, finish: str | None) -> dict:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return {"id": request_id, "object": "text_completion", "created": created, "model": MODEL, "choices": [choice]}


async def completions(request: Request) -> Response:
    """OpenAI completions: ``max_tokens`` one-token chunks (default 16), streamed or in one body."""
    body = await request.json()
    n = int(body.get("max_tokens") or 16)
    created, request_id = int(time.time()), f"cmpl-null-{time.monotonic_ns()}"
    usage = {
        "prompt_tokens": _prompt_tokens(body.get("prompt")),
        "completion_tokens": n,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    usage["total_tokens"] = usage["prompt_tokens"] + n
    if not body.get("stream"):
        whole = _chunk(request_id, created, " x" * n, "length")
        return JSONResponse({**whole, "usage": usage})

    async def events():
        for i in range(n):
            chunk = _chunk(request_id, created, " x", "length" if i == n - 1 else None)
            yield f"data: {json.dumps(chunk)}\n\n"
        if (body.get("stream_options") or {}).get("include_usage"):
            yield f"data: {json.dumps({**_chunk(request_id, created, '', None), 'choices': [], 'usage': usage})}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


async def models(_: Request) -> Response:
    """OpenAI's model list: the one model."""
    return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "null-engine"}]})


async def health(_: Request) -> Response:
    """200, empty (vLLM's ``/health``)."""
    return Response(status_code=200)


async def metrics(_: Request) -> Response:
    """The Prometheus page kvcost scrapes: an idle engine."""
    return PlainTextResponse(_METRICS)


app = Starlette(
    routes=[
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models),
        Route("/health", health),
        Route("/metrics", metrics),
    ]
)


class NullEngine:
    """This server as a process on 127.0.0.1 (uvicorn, uvloop and httptools, no access log), in its own group.

    Args:
        http_port: the port to serve on.
        log_dir: folder of its log file.

    ``base_url``, ``start()`` (waits until ``/health`` answers, at most ``timeout_s``) and ``stop()``
    as for :class:`tests.e2e.engines.VLLMEngine`.
    """

    def __init__(self, http_port: int, log_dir: str | Path) -> None:
        self.base_url = f"http://127.0.0.1:{http_port}"
        self.port = http_port
        self.log = Path(log_dir) / f"null-engine-{http_port}.log"
        self.process: subprocess.Popen | None = None

    def start(self, timeout_s: float = 60.0) -> None:
        """Start the process and wait for ``/health``.

        Raises:
            TimeoutError: not ready within ``timeout_s`` (the log's tail in the message).
        """
        args = [sys.executable, "-m", "uvicorn", "tests.e2e.null_engine:app", "--port", str(self.port)]
        args += ["--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning"]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.base_url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise TimeoutError(f"null engine not ready:\n{self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        """SIGTERM to its process group (then SIGKILL after 10 s)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
