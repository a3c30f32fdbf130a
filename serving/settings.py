"""Configuration of ``kvcost serve``: :class:`ServiceSettings` and the parsers of its option values."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from kvcost.core.engine_profile import EngineProfile
from kvcost.core.hardware import GPUS, MODELS, check_tensor_parallel, resolve_model
from kvcost.core.types import Namespace
from kvcost.data.store import DEFAULT_LOG_PATH
from kvcost.models.mlflow_store import check_tracking_uri
from kvcost.routing.block_hash import DEFAULT_HASH_ALGORITHM, HASH_ALGORITHMS
from kvcost.routing.compatibility import parse_layout
from kvcost.routing.directory import DEFAULT_MAX_BLOCKS_PER_WORKER
from kvcost.routing.policies import ROUTER_POLICIES
from kvcost.serving.engines.engine_metrics import parse_scrape_target
from kvcost.serving.engines.kv_subscriber import KVEventSource
from kvcost.serving.schemas import MAX_BLOCK_SIZE_TOKENS


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP addresses (127.0.0.0/8, ::1); False for any other name or address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ServiceSettings(BaseSettings):
    """Configuration of ``kvcost serve``: its options are generated from these fields (``gpu_default`` is
    ``--gpu``, ``hash_algorithm`` ``--prefix-caching-hash-algo``, ``db_path`` ``--db``).

    Every field can also be set by an environment variable ``KVCOST_<FIELD>`` (case-insensitive; e.g.
    ``KVCOST_PORT=9000``, ``KVCOST_GPU_DEFAULT=h100``, list fields as JSON:
    ``KVCOST_KV_EVENTS='["0=tcp://engine0:5557"]'``), including those ``kvcost serve`` has no option
    for (``KVCOST_MAX_DECISIONS``, ``KVCOST_SCRAPE_TIMEOUT_S`` ...). Precedence: keyword argument
    (a CLI option) over environment variable over default.

    Refuses an unsafe setup: a non-loopback ``host`` without ``token_file``
    leaves the write endpoints open to the network, and is accepted only with
    ``insecure=True``.
    """

    model_config = SettingsConfigDict(frozen=True, extra="forbid", env_prefix="KVCOST_")

    db_path: Path = Field(DEFAULT_LOG_PATH, description="DuckDB log the service appends to (it holds the write lock)")
    mlflow_uri: str | None = Field(None, description="MLflow tracking URI of the champion; None = analytic only")
    token_file: Path | None = Field(None, description="file holding the bearer token required by the write endpoints")
    host: str = Field("127.0.0.1", description="address to listen on; non-loopback needs --token-file or --insecure")
    port: int = Field(8000, ge=0, le=65535, description="TCP port")
    insecure: bool = Field(False, description="allow a non-loopback --host without a token")
    protect_reads: bool = Field(
        False,
        description="require the --token-file token on the read endpoints too: /v1/score, /v1/evict/rank, "
        "GET /v1/cost-models and the gateway's GET /v1/models (health, readiness and metrics stay open)",
    )
    model: str = Field(
        "llama-3-8b",
        description=f"model served by every worker: {', '.join(MODELS.names())}, or a path to its Hugging Face "
        "config.json (its hardware profile)",
    )
    tensor_parallel: int = Field(1, ge=1, le=64, description="GPUs per worker (tensor-parallel degree) of the model")
    profile: list[Path] = Field(
        default_factory=list,
        description="kvcost profile file (repeatable): adds a GPU type named after it (snapshots and --gpu use it)",
    )
    gpu_default: str = Field("a100", description="GPU type of a worker snapshot that names none")
    block_size_tokens: int = Field(
        512, ge=1, le=MAX_BLOCK_SIZE_TOKENS, description="KV block size of a request namespace without one"
    )
    policy: str = Field("learned_cost_aware", description="router policy of /v1/route")
    tiers: bool = Field(
        False,
        description="engines offload KV to CPU / disk (e.g. LMCache): prefixes their KV events report there "
        "(medium CPU, ...) are reusable, paying their load time in L",
    )
    reuse_model_dir: Path | None = Field(
        None,
        description="folder of a saved P(reuse) model for /v1/evict/rank's cost_aware, which then uses it and "
        "its H (kvcost eviction-study writes one per cache size: OUT/reuse_models/fraction_*); default: the "
        "recency prior",
    )
    max_body_bytes: int = Field(16 * 2**20, ge=1024, description="larger request bodies are refused with 413")
    max_rank_body_bytes: int = Field(
        48 * 2**20,
        ge=1024,
        description="the same for /v1/evict/rank, parsed in a worker process: 100,000 nodes (its most) are "
        "17 MiB with the fields the study sends, up to ~35 MiB with every field at its longest",
    )
    max_decisions: int = Field(100_000, ge=1, description="decisions kept in memory for /v1/observe (LRU)")
    max_workers: int = Field(65_536, ge=1, description="workers with a pushed snapshot")
    heavy_workers: int = Field(
        1, ge=1, le=64, description="worker processes that parse and rank /v1/evict/rank bodies off the event loop"
    )
    heavy_queue_limit: int = Field(
        4, ge=0, description="/v1/evict/rank requests that may wait for a busy worker; more get 503 + Retry-After"
    )
    heavy_body_bytes: int = Field(
        1 << 20,
        ge=0,
        description="/v1/score and /v1/route bodies larger than this are parsed and their tokens hashed in the "
        "worker processes, not on the event loop (~128k token ids; an 8k-token body is ~60 KiB)",
    )
    max_directory_blocks_per_worker: int = Field(
        DEFAULT_MAX_BLOCKS_PER_WORKER,
        ge=1,
        description="blocks one worker may hold in the KV directory (every tier; approximate and in-flight "
        "prefixes too); past it its oldest stored blocks are dropped and counted "
        "(kvcost_directory_capped_blocks_total). About 100 bytes per block: the default 2^20 is ~100 MB per worker",
    )
    max_queued_writes: int = Field(100_000, ge=1, description="log writes queued before writes are refused")
    decision_linger_s: float = Field(
        0.5,
        ge=0,
        le=10,
        description="decisions (and gateway observations) wait up to this long to be committed together: each "
        "insert costs ~6.5 ms of CPU whatever its rows, so grouping keeps the CPU per request low",
    )
    model_load_timeout_s: float = Field(60.0, gt=0, description="champion load / registry listing timeout")
    segment_roll_interval_s: float = Field(
        60.0, ge=0, description="roll the log into Parquet segments for readers (kvcost retrain) this often; 0 = never"
    )
    run_id: str | None = Field(None, max_length=128, description="log run id; None = serve-<UTC time>-<random>")
    hash_algorithm: str = Field(
        DEFAULT_HASH_ALGORITHM,
        description=f"the engines' --prefix-caching-hash-algo ({', '.join(HASH_ALGORITHMS)}; vLLM's default is "
        f"{DEFAULT_HASH_ALGORITHM}): token ids are hashed as they hash them",
    )
    hash_seed: str = Field(
        "0",
        max_length=256,
        description="the engines' PYTHONHASHSEED (vLLM seeds its block-hash chain with it; without one, vLLM "
        "0.32 seeds sha256 and sha256_cbor with 'vllm-none-hash' and the xxhash algorithms at random, which no "
        "router can match)",
    )
    hash_extra_keys: Literal["tagged", "bare"] = Field(
        "tagged",
        description="how the engines hash a block's extra keys (LoRA, cache salt): tagged as vLLM 0.32 does, "
        "('cache_salt', salt), or bare values as earlier releases did",
    )
    lora_modules: list[str] = Field(
        default_factory=list,
        description="the engines' --lora-modules NAME=PATH, one per adapter (repeat the option): vLLM 0.32 "
        "hashes the path into an adapter's blocks; a LoRA request is matched only with its path known",
    )
    hash_cache_blocks: int = Field(
        16_384,
        ge=0,
        le=2**24,
        description="block digests kept so that shared prefixes are hashed once (LRU; about 150 + 4 × block "
        "size bytes each); 0 = no cache",
    )
    kv_events: list[str] = Field(
        default_factory=list,
        description="vLLM KV event stream WORKER=tcp://HOST:PORT, or WORKER=PUB,REPLAY with the engine's replay "
        "socket (missed batches are then asked for again); one per worker (repeat the option)",
    )
    in_flight_min_ttl_s: float = Field(
        10.0,
        ge=0,
        le=3600,
        description="a prefix routed by /v1/route counts as in flight (reusable by the next request) at least "
        "this long unless its request's outcome comes sooner: live engines may run far slower than the profile "
        "of --model on --gpu predicts (the gateway keeps its own requests' prefixes until their outcome)",
    )
    in_flight_gateway_ttl_s: float = Field(
        300.0,
        gt=0,
        le=86_400,
        description="gateway: a prefix it routed counts as in flight until its request's first token or failure, "
        "at most this long (a bound on what a lost outcome can cost; a request queued longer loses the count)",
    )
    in_flight_release_grace_s: float = Field(
        1.0,
        ge=0,
        le=60,
        description="an in-flight prefix stays this long after its request's first token: the engine's KV "
        "event for the blocks it stored reaches the directory after the token reaches the gateway",
    )
    kv_replay_timeout_s: float = Field(
        2.0,
        gt=0,
        le=60,
        description="a replay of missed KV event batches gives up when the engine's replay socket is silent this "
        "long (the worker is then marked stale); the engine's events wait meanwhile",
    )
    served_model_name: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="model name requests carry (the engines' --served-model-name); default: --model",
    )
    revision: str = Field(
        "main", min_length=1, max_length=256, description="model revision of the engines (their --revision)"
    )
    kv_layout: str = Field(
        "bf16-tp1", max_length=256, description="KV dtype and tensor-parallel split of the engines, as requests name it"
    )
    scrape: list[str] = Field(
        default_factory=list,
        description="engine metrics WORKER=http://HOST:PORT/metrics (vLLM or SGLang), one per worker (repeat "
        "the option); each scrape becomes the worker's snapshot, as a POST /v1/workers/WORKER/snapshot would",
    )
    scrape_interval_s: float = Field(1.0, gt=0, le=3600, description="seconds between two scrapes of every engine")
    scrape_timeout_s: float = Field(1.0, gt=0, le=60, description="limit of one scrape's HTTP request")
    engines: list[str] = Field(
        default_factory=list,
        description="gateway mode: an OpenAI-compatible engine WORKER=http://HOST:PORT (vLLM), one per worker "
        "(repeat the option); kvcost then serves /v1/completions and /v1/chat/completions, routes each request "
        "and forwards it, and scrapes each engine's /metrics unless --scrape names that worker",
    )
    tokenizer: Path | None = Field(
        None,
        description="gateway: folder of the served model's tokenizer (Hugging Face format); prompts are tokenized "
        "here, chat through its chat template; default: each request is tokenized by an engine's /tokenize",
    )
    engine_connect_timeout_s: float = Field(5.0, gt=0, le=600, description="gateway: limit of connecting to an engine")
    engine_read_timeout_s: float = Field(
        600.0, gt=0, le=86_400, description="gateway: longest wait for an engine's next bytes (first token included)"
    )
    engine_backoff_s: float = Field(
        1.0, gt=0, le=600, description="gateway: an engine that failed is skipped this long, doubling per failure"
    )
    engine_backoff_max_s: float = Field(30.0, gt=0, le=3600, description="gateway: longest backoff of an engine")
    routed_ttl_s: float = Field(
        120.0,
        gt=0,
        le=86_400,
        description="approximate directory mode (workers without --kv-events): a prefix routed to a worker "
        "counts as cached there for this long",
    )

    def event_namespace(self) -> Namespace:
        """Namespace of the blocks the KV event streams report: a request reuses them only if its
        namespace (model, revision, adapter, block size, KV layout) is this one (an adapter's own
        blocks: the same with the event's ``lora_name``)."""
        return Namespace(
            self.served_model_name or self.model,
            revision=self.revision,
            block_size_tokens=self.block_size_tokens,
            kv_layout=self.kv_layout,
        )

    def lora_paths(self) -> dict[str, str]:
        """``lora_modules`` as adapter name → path.

        Raises:
            ValueError: an entry that is not ``NAME=PATH``, or a name given twice.
        """
        paths: dict[str, str] = {}
        for spec in self.lora_modules:
            name, sep, path = spec.partition("=")
            if not sep or not name or not path or name in paths:
                raise ValueError(
                    f"lora_modules entry {spec!r}, expected NAME=PATH (each name once) such as 'sql-lora=/adapters/sql'"
                )
            paths[name] = path
        return paths

    @model_validator(mode="after")
    def _check(self) -> ServiceSettings:
        if self.mlflow_uri is not None:
            check_tracking_uri(self.mlflow_uri)
        if self.protect_reads and self.token_file is None:
            raise ValueError("protect_reads = True needs token_file (--token-file): there is no token to require")
        check_tensor_parallel(resolve_model(self.model), self.tensor_parallel)
        known = [*GPUS.names(), *(EngineProfile.load(path).name for path in self.profile)]
        if self.gpu_default not in known:
            raise ValueError(f"gpu_default = {self.gpu_default!r}, expected one of {', '.join(known)}")
        _check_policy(self.policy)
        if self.hash_algorithm not in HASH_ALGORITHMS:
            raise ValueError(f"hash_algorithm = {self.hash_algorithm!r}, expected one of {', '.join(HASH_ALGORITHMS)}")
        if self.reuse_model_dir is not None and not self.reuse_model_dir.is_dir():
            raise ValueError(
                f"reuse_model_dir = {str(self.reuse_model_dir)!r} is not a folder, expected one that kvcost "
                "eviction-study wrote (OUT/reuse_models/fraction_*)"
            )
        parse_layout(self.kv_layout)
        fed = [parse_kv_event_source(spec).worker_id for spec in self.kv_events]
        if len(set(fed)) != len(fed):
            raise ValueError(f"kv_events names worker ids {fed}; each worker may have one event stream")
        scraped = [parse_scrape_target(spec).worker_id for spec in self.scrape]
        if len(set(scraped)) != len(scraped):
            raise ValueError(f"scrape names worker ids {scraped}; each worker may be scraped once")
        self.lora_paths()
        engines = [parse_engine(spec)[0] for spec in self.engines]
        if len(set(engines)) != len(engines):
            raise ValueError(f"engines names worker ids {engines}; each worker may have one engine")
        if self.tokenizer is not None and not self.tokenizer.is_dir():
            raise ValueError(
                f"tokenizer = {str(self.tokenizer)!r} is not a folder, expected a Hugging Face tokenizer folder "
                "(tokenizer.json, tokenizer_config.json)"
            )
        if not is_loopback(self.host) and self.token_file is None and not self.insecure:
            raise ValueError(
                f"host = {self.host!r} is not a loopback address and no token file is given: the write "
                "endpoints would be open to the network; pass --token-file FILE (or --insecure)"
            )
        return self


def _check_policy(name: str) -> None:
    """Raise ``ValueError`` unless ``name`` is a registered router policy the service can run.

    A policy whose class is ``replay_only`` (it needs the simulator's truth, e.g. ``oracle``) is refused.
    """
    usable = [p for p in ROUTER_POLICIES.names() if not ROUTER_POLICIES.get(p).replay_only]
    if name not in usable:
        why = " (replay-only: it needs the simulator's truth)" if name in ROUTER_POLICIES else ""
        raise ValueError(f"policy = {name!r}, expected one of {', '.join(usable)}{why}")


def parse_kv_event_source(spec: str) -> KVEventSource:
    """Parse ``WORKER=PUB[,REPLAY]`` (each ``tcp://HOST:PORT`` or ``ipc://PATH``) into a source.

    ``PUB`` is the engine's KV event publisher (vLLM ``--kv-events-config``
    ``endpoint``), ``REPLAY`` its optional replay ROUTER socket (``replay_endpoint``):
    with it a gap in the sequence numbers is filled by asking the engine for the
    missed batches; without it the worker's entries are marked stale.

    Raises:
        ValueError: naming the entry and the expected form (a port outside 1–65535,
            an empty host or path, a scheme other than tcp / ipc).
    """
    expected = "expected WORKER=tcp://HOST:PORT[,tcp://HOST:PORT] such as '0=tcp://10.0.0.5:5557,tcp://10.0.0.5:5558'"
    worker, sep, endpoints = spec.partition("=")
    parts = endpoints.split(",")
    if not sep or not worker.strip().isdigit() or len(parts) > 2 or not all(map(_is_zmq_endpoint, parts)):
        raise ValueError(f"kv_events entry {spec!r}, {expected}")
    if len(parts) == 2 and parts[0] == parts[1]:
        raise ValueError(f"kv_events entry {spec!r} gives one endpoint for both sockets, {expected}")
    return KVEventSource(int(worker), parts[0], replay_endpoint=parts[1] if len(parts) == 2 else None)


def parse_engine(spec: str) -> tuple[int, str]:
    """Parse ``WORKER=http://HOST:PORT`` (an OpenAI-compatible engine's base URL) into ``(worker_id, url)``.

    The URL is returned without a trailing ``/`` (``/v1/completions`` is appended to it).

    Raises:
        ValueError: naming the entry and the expected form.
    """
    worker, sep, url = spec.partition("=")
    host = url.split("://", 1)[-1].split("/", 1)[0]
    if not sep or not worker.strip().isdigit() or not url.startswith(("http://", "https://")) or not host:
        raise ValueError(f"engines entry {spec!r}, expected WORKER=http://HOST:PORT such as '0=http://10.0.0.5:8000'")
    return int(worker), url.rstrip("/")


def _is_zmq_endpoint(endpoint: str) -> bool:
    """``tcp://HOST:PORT`` with a host and a port in 1–65535, or ``ipc://PATH`` with a path."""
    if endpoint.startswith("ipc://"):
        return len(endpoint) > len("ipc://")
    if not endpoint.startswith("tcp://"):
        return False
    host, sep, port = endpoint[len("tcp://") :].rpartition(":")
    return bool(sep and host and host != "*" and port.isdigit() and 1 <= int(port) <= 65535)


def read_token(path: Path) -> str:
    """The bearer token in ``path`` (surrounding whitespace stripped).

    Raises:
        FileNotFoundError: no such file. ValueError: the file is empty.
    """
    if not path.is_file():
        raise FileNotFoundError(f"token_file = {str(path)!r} does not exist")
    token = path.read_text().strip()
    if not token:
        raise ValueError(f"token_file = {str(path)!r} is empty, expected a bearer token")
    return token
