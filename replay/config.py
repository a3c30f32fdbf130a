"""Cluster configuration of a replay, and parsing of its CLI forms (``--fleet``, ``--slowdown``)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import lru_cache

from kvcost.core.engine_profile import EngineProfile
from kvcost.core.hardware import DEFAULT_GPU_MEMORY_UTILIZATION, GPUS, StepTimeModel, resolve_model
from kvcost.eviction import EVICTION_POLICIES
from kvcost.replay.tiers import TierConfig
from kvcost.routing.router import RouterSettings


@dataclass(frozen=True, slots=True)
class Slowdown:
    """Worker ``worker_id`` runs at ``speed_fraction`` of its nominal speed from replay time ``from_s`` on.

    ``speed_fraction`` 0.6 means step times ÷ 0.6 (a straggler at 60 % speed); values
    above 1 make a worker faster than its GPU type's profile.
    """

    worker_id: int
    speed_fraction: float
    from_s: float = 0.0


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Everything that defines one simulated cluster run.

    Attributes:
        model: model name (``kvcost.core.specs.MODELS``) or path to a Hugging Face ``config.json``.
        fleet: GPU type per worker, e.g. ``("a100", "a100", "h100", "h100")``.
        token_budget: tokens per continuous-batching step (vLLM ``max_num_batched_tokens``; default 8192).
        tensor_parallel: GPUs per worker (tensor-parallel degree, ≥ 1, dividing the model's attention
            heads): a worker's step is one GPU's shard plus the all-reduces, and its KV capacity
            is the group's.
        cache_enabled: prefix cache on or off.
        kv_capacity_blocks: KV blocks per worker; None derives it from GPU memory, weights
            and reserve (``StepTimeModel.kv_capacity_blocks``).
        gpu_memory_utilization: share of GPU memory the engine may use (vLLM's default 0.9),
            in (0, 1]; used when ``kv_capacity_blocks`` is None.
        directory_lag_s: delay before a worker's KV events reach the router's directory (≥ 0).
        jitter_sigma: σ of the seeded log-normal per-step jitter (ground truth only).
        slowdowns: stragglers (ground truth only).
        seed: seed of every random stream of the run.
        sample_interval_s: period of the ``worker_samples`` log.
        warmup_s: requests arriving before this are simulated (they warm the cache) but not measured.
        router: the router's settings (policy, limits; ``router.tiers`` / ``router.transfers``
            make it plan lower-tier loads and fetches).
        tiers: CPU / disk tiers per worker and a shared remote store behind the GPU
            pools (``kvcost.replay.tiers``); None = GPU only.
        eviction_policy: registered KV eviction policy of every worker's pool
            (``kvcost.eviction``; default ``lru``, vLLM's order).
        profiles: ``kvcost profile`` files; each adds a GPU type named after it that ``fleet``
            may name (its step time is the measured engine's, :mod:`kvcost.core.engine_profile`).
    """

    model: str = "llama-3-8b"
    fleet: tuple[str, ...] = ("a100",) * 4
    token_budget: int = 8192
    tensor_parallel: int = 1
    cache_enabled: bool = True
    kv_capacity_blocks: int | None = None
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    directory_lag_s: float = 0.0
    jitter_sigma: float = 0.05
    slowdowns: tuple[Slowdown, ...] = ()
    seed: int = 0
    sample_interval_s: float = 1.0
    warmup_s: float = 0.0
    router: RouterSettings = field(default_factory=RouterSettings)
    tiers: TierConfig | None = None
    eviction_policy: str = "lru"
    profiles: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        resolve_model(self.model)
        EVICTION_POLICIES.get(self.eviction_policy)
        if not self.fleet:
            raise ValueError("fleet is empty, expected at least one worker")
        measured = _load_profiles(self.profiles)
        for gpu in self.fleet:
            if gpu not in measured:
                GPUS.get(gpu)
        _check(self.token_budget >= 1, "token_budget", self.token_budget, "an integer ≥ 1")
        _check(self.tensor_parallel >= 1, "tensor_parallel", self.tensor_parallel, "an integer ≥ 1")
        if self.kv_capacity_blocks is not None:
            _check(self.kv_capacity_blocks >= 1, "kv_capacity_blocks", self.kv_capacity_blocks, "an integer ≥ 1")
        _check(
            0 < self.gpu_memory_utilization <= 1,
            "gpu_memory_utilization",
            self.gpu_memory_utilization,
            "a number in (0, 1]",
        )
        _check(self.directory_lag_s >= 0, "directory_lag_s", self.directory_lag_s, "a number ≥ 0")
        _check(self.jitter_sigma >= 0, "jitter_sigma", self.jitter_sigma, "a number ≥ 0")
        _check(self.sample_interval_s > 0, "sample_interval_s", self.sample_interval_s, "a number > 0")
        _check(self.warmup_s >= 0, "warmup_s", self.warmup_s, "a number ≥ 0")
        for slow in self.slowdowns:
            _check(
                0 <= slow.worker_id < len(self.fleet),
                "slowdown worker",
                slow.worker_id,
                f"a worker index in [0, {len(self.fleet) - 1}]",
            )
            _check(
                slow.speed_fraction > 0 and math.isfinite(slow.speed_fraction),
                "slowdown speed fraction",
                slow.speed_fraction,
                "a number > 0",
            )

    @property
    def workers(self) -> int:
        """Number of workers."""
        return len(self.fleet)

    def check_hardware(self) -> None:
        """Check that every GPU type of the fleet can run the model: its step-time model builds (the
        tensor-parallel degree divides the attention heads) and, unless :attr:`kv_capacity_blocks` is
        given, the weights leave KV capacity. Not part of construction: it costs about 30 ms a GPU type.

        Raises:
            ValueError: the message names ``tensor_parallel`` or ``model``, the value and what was expected.
        """
        for gpu in dict.fromkeys(self.fleet):
            step_model = self.step_model(gpu)
            if self.kv_capacity_blocks is None:
                step_model.kv_capacity_tokens(self.gpu_memory_utilization)

    def step_model(self, gpu: str) -> StepTimeModel:
        """The step-time model of a worker of type ``gpu``: a profile's (:attr:`profiles`) or the
        model's on that GPU at :attr:`tensor_parallel`, with :attr:`token_budget`."""
        measured = _load_profiles(self.profiles)
        if gpu in measured:
            return measured[gpu].step_time_model(self.token_budget)
        return StepTimeModel.for_hardware(self.model, gpu, tp=self.tensor_parallel, token_budget=self.token_budget)


def _check(ok: bool, field_name: str, value: object, expected: str) -> None:
    if not ok:
        raise ValueError(f"{field_name} = {value!r}, expected {expected}")


def profile_names(paths: tuple[str, ...]) -> list[str]:
    """The GPU type names of the ``kvcost profile`` files ``paths``.

    Raises:
        FileNotFoundError, ValueError: a file that is not a readable profile.
    """
    return list(_load_profiles(tuple(paths)))


@lru_cache(maxsize=32)
def _load_profiles(paths: tuple[str, ...]) -> dict[str, EngineProfile]:
    """The profiles of ``paths`` by name (read once per tuple of paths)."""
    return {p.name: p for p in map(EngineProfile.load, paths)}


def parse_fleet(spec: str | None, workers: int, extra_gpus: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Parse ``--fleet`` (``"a100:2,h100:2"``); None means ``workers`` × ``a100``. ``extra_gpus``:
    further GPU type names (those of ``--profile`` files).

    Raises:
        ValueError: malformed item, unknown GPU, count < 1, or a total different from ``workers``
            (when ``workers`` is given and the spec is not None).
    """
    if spec is None:
        return ("a100",) * workers
    fleet: list[str] = []
    for item in spec.split(","):
        match = re.fullmatch(r"\s*([A-Za-z0-9_-]+)\s*(?::\s*(\d+))?\s*", item)
        if not match:
            raise ValueError(f"fleet item {item!r}, expected GPU[:COUNT] such as 'a100:2'")
        gpu, count = match.group(1).lower(), int(match.group(2) or 1)
        if gpu not in GPUS and gpu not in extra_gpus:
            raise ValueError(f"fleet GPU {gpu!r}, expected one of {', '.join([*GPUS.names(), *extra_gpus])}")
        _check(count >= 1, "fleet count", count, "an integer ≥ 1")
        fleet.extend([gpu] * count)
    if workers and len(fleet) != workers:
        raise ValueError(f"fleet {spec!r} has {len(fleet)} workers, expected --workers {workers}")
    return tuple(fleet)


def parse_slowdown(spec: str) -> Slowdown:
    """Parse ``--slowdown WORKER:SPEED[@T_S]`` (e.g. ``"1:0.6@600"``: worker 1 at 60 % speed from 600 s).

    Raises:
        ValueError: the spec does not match, naming the value and the expected form.
    """
    match = re.fullmatch(r"\s*(\d+)\s*:\s*([0-9.eE+-]+)\s*(?:@\s*([0-9.eE+-]+))?\s*", spec)
    if not match:
        raise ValueError(f"slowdown {spec!r}, expected WORKER:SPEED[@T_S] such as '1:0.6@600'")
    try:
        factor = float(match.group(2))
        from_s = float(match.group(3)) if match.group(3) else 0.0
    except ValueError:
        raise ValueError(f"slowdown {spec!r}, expected numbers in WORKER:SPEED[@T_S]") from None
    _check(from_s >= 0, "slowdown start", from_s, "a time ≥ 0 s")
    _check(factor > 0 and math.isfinite(factor), "slowdown speed fraction", factor, "a number > 0")
    return Slowdown(int(match.group(1)), factor, from_s)
