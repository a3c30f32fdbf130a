"""The gateway's cost, measured against one real vLLM engine: ``.venv/bin/python -m tests.e2e.overhead``.

``--engine null`` measures it against :mod:`tests.e2e.null_engine` instead, an HTTP server that
answers at once: the gateway's own added TTFT, without a real engine's CPU on the same cores.

* **Added TTFT**: requests sent straight to the engine and through the gateway
  (fronting that one engine alone), interleaved, in one run at 50 requests/s:
  TTFT at the first streamed chunk as the client sees it, P50 / P99 of each path
  and their differences.
* **Tokenization per request**: the gateway's local tokenizer (``--tokenizer``)
  and the engine's ``/tokenize``, on the same completion and chat bodies.

Prints the figures (docs/gateway.md keeps the measured ones). Needs ``make engine``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np

from kvcost.serving.gateway.engine_http import engine_client
from kvcost.serving.gateway.tokenize import EngineTokenizer, LocalTokenizer
from kvcost.serving.settings import ServiceSettings
from tests.e2e.engines import VLLMEngine, free_port, start_all
from tests.e2e.kvcost_serve import KvcostServe
from tests.e2e.null_engine import NullEngine
from tests.e2e.test_gateway_vllm import ENGINE_VENV, ROOT
from tests.e2e.traffic import Spec, block_text, block_tokens, send


def _bodies(count: int, first: int = 0) -> list[dict]:
    """Short completions (4 blocks, 8 tokens out), each its own prefix: the added cost, not the cache, is measured.
    ``first``: the index of the first (bodies of other indexes share no block)."""
    bodies = []
    for i in range(first, first + count):
        prompt = [t for h in range(4) for t in block_tokens(10_000 + 4 * i + h)]
        bodies.append({"model": "tiny", "prompt": prompt, "max_tokens": 8, "stream": True, "ignore_eos": True})
    return bodies


async def _interleaved(
    engine_url: str, gateway_url: str, rate_per_s: float, count: int, first: int = 0
) -> tuple[dict[str, list[float]], dict[str, Counter]]:
    """TTFT (s) of each path's requests that streamed output, and each path's failures counted by message."""
    ttft: dict[str, list[float]] = {"direct": [], "gateway": []}
    failures: dict[str, Counter] = {"direct": Counter(), "gateway": Counter()}
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=None)) as client:
        tasks = []
        start = time.perf_counter()
        for i, body in enumerate(_bodies(count, first)):
            await asyncio.sleep(max(0.0, start + i / rate_per_s - time.perf_counter()))
            path = "direct" if i % 2 == 0 else "gateway"
            url = engine_url if path == "direct" else gateway_url
            tasks.append((path, asyncio.create_task(send(client, url, Spec(i, "completion", body), {}))))
        for path, task in tasks:
            result = await task
            if result.ttft_s is not None and not result.error:
                ttft[path].append(result.ttft_s)
            else:
                failures[path][(result.error or f"HTTP {result.status}, no output")[:160]] += 1
    return ttft, failures


async def _tokenize_costs(engine_url: str, model_dir: Path, n: int) -> dict[str, float]:
    local = LocalTokenizer(model_dir)
    completion = {"model": "tiny", "prompt": " ".join(block_text(h) for h in range(40))}
    chat = {"model": "tiny", "messages": [{"role": "user", "content": completion["prompt"]}]}
    costs = {}
    settings = ServiceSettings(engine_read_timeout_s=10)
    async with engine_client(settings) as client, engine_client(settings, fresh=True) as fresh:
        remote = EngineTokenizer(client, fresh, engine_url)
        for name, tokenizer in (("local", local), ("engine", remote)):
            for kind, body, call in (("completion", completion, "completion_ids"), ("chat", chat, "chat_ids")):
                samples = []
                for _ in range(n):
                    start = time.perf_counter()
                    await getattr(tokenizer, call)(body)
                    samples.append(time.perf_counter() - start)
                costs[f"{name} {kind}"] = statistics.median(samples)
    return costs


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/PID/stat``, Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start_engine(kind: str, work: Path) -> tuple[VLLMEngine | NullEngine, list[str]]:
    """The started engine and the gateway's tokenizer arguments (the tiny model's tokenizer for vLLM)."""
    if kind == "null":
        engine = NullEngine(free_port(), work)
        engine.start()
        return engine, []
    model = work / "tiny-model"
    subprocess.run([str(ENGINE_VENV / "bin/python"), str(ROOT / "tests/e2e/tiny_model.py"), str(model)], check=True)
    engine = VLLMEngine(model, free_port(), free_port(), free_port(), num_gpu_blocks=2000, log_dir=work)
    start_all([engine], timeout_s=400)
    return engine, ["--tokenizer", str(model)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=50.0, help="requests/s, both paths together")
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--warm-up", type=int, default=200, help="requests sent first, not timed")
    parser.add_argument(
        "--engine",
        choices=("vllm", "null"),
        default="vllm",
        help="vllm: one real engine (needs make engine); null: tests.e2e.null_engine, which answers at once, "
        "so the added TTFT is the gateway's own (no tokenization costs then)",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kvcost-overhead-"))
    engine, gateway_args = _start_engine(args.engine, work)
    serve = KvcostServe(
        ["--engine", f"0={engine.base_url}", *gateway_args, "--analytic-only", "--block-size-tokens", "32",
         "--prefix-caching-hash-algo", "sha256_cbor", "--served-model-name", "tiny"],
        work,
        roll_interval_s=60.0,  # the service's default
    )  # fmt: skip
    costs = {}
    try:
        serve.start()
        # not timed: the engine's first requests, and the service's start (its heavy-request worker imports)
        asyncio.run(_interleaved(engine.base_url, serve.url, args.rate, args.warm_up))
        cpu_before_s = _cpu_s(serve.process.pid)
        ttft, failures = asyncio.run(_interleaved(engine.base_url, serve.url, args.rate, args.requests, args.warm_up))
        gateway_cpu_s = _cpu_s(serve.process.pid) - cpu_before_s
        if args.engine == "vllm":
            costs = asyncio.run(_tokenize_costs(engine.base_url, work / "tiny-model", 200))
    finally:
        serve.stop()
        engine.stop()
    print(f"engine: {args.engine}")
    for path, counts in failures.items():
        for message, n in counts.most_common(5):
            print(f"failed ({path}): {n} × {message}")
    p = {path: np.percentile(values, [50, 99]) * 1000 for path, values in ttft.items()}
    print(f"requests: {len(ttft['direct'])} direct, {len(ttft['gateway'])} through the gateway, {args.rate:g}/s")
    for path in ("direct", "gateway"):
        print(f"TTFT {path}: P50 {p[path][0]:.2f} ms, P99 {p[path][1]:.2f} ms")
    added = p["gateway"] - p["direct"]
    print(f"added by the gateway: P50 {added[0]:.2f} ms, P99 {added[1]:.2f} ms")
    print(f"gateway process CPU per request: {gateway_cpu_s / max(1, len(ttft['gateway'])) * 1000:.2f} ms")
    for name, seconds in costs.items():
        print(f"tokenize ({name}, 40 sentences): median {seconds * 1000:.3f} ms")


if __name__ == "__main__":
    main()
