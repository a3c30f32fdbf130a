"""The settings of a trace replay, shared by ``kvcost experiment``, ``replay``, ``bench`` and ``eviction-study``.

:class:`ReplaySettings` is the one table of these options: each field's type,
default, help text and range is defined here and the CLI's options are
generated from it (``kvcost.cli.options``). The cluster fields take their
defaults from :class:`kvcost.replay.config.ClusterConfig`, which also checks
them; the trace window is checked by :func:`kvcost.data.traces.load_trace`.
"""

from __future__ import annotations

import math
from dataclasses import fields
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kvcost.core.hardware import MODELS
from kvcost.data.store import DEFAULT_LOG_PATH
from kvcost.data.traces import BUNDLED_TRACES
from kvcost.eviction import EVICTION_POLICIES
from kvcost.replay.config import ClusterConfig

#: Default rate scale (arrival times ÷ 0.55): it puts the balanced, cache-off configuration of the
#: bundled conversation trace on 4 × A100 (Llama-3-8B) at about 80 % utilisation (measured: README,
#: "the default rate scale"), loaded enough that caching and routing matter, not saturated.
DEFAULT_RATE_SCALE = 0.55
#: The trace a replay uses when none is named.
DEFAULT_TRACE = "mooncake-conversation"
#: ``kvcost eviction-study``: replay seconds between refits of ``cost_aware``'s P(reuse) on the pools'
#: own block history (:mod:`kvcost.replay.reuse_refit`). Chosen on the validation windows inside the
#: conversation trace's training part (docs/eviction-study.md, "Refitting P(reuse) online") among never,
#: 300 s and 600 s: 300 s saved the most prefill seconds summed over seeds 0-2 in both windows.
DEFAULT_REFIT_EVERY_S = 300.0

_CLUSTER_DEFAULTS = {f.name: f.default for f in fields(ClusterConfig)}


def _cluster_default(name: str) -> object:
    """Default of :class:`ClusterConfig` field ``name`` (defined there once)."""
    return _CLUSTER_DEFAULTS[name]


class ReplaySettings(BaseModel):
    """Trace window, cluster and outputs of one replay study (the CLI's options map one to one).

    ``start_s`` and ``duration_s`` are *trace* time; ``warmup_s`` and the ``@T_S`` of a slowdown
    are *replay* time (trace time ÷ ``rate_scale``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    trace: str = Field(
        DEFAULT_TRACE, description=f"Bundled trace ({', '.join(BUNDLED_TRACES)}), gen:<shape>[:k=v,...] or a path."
    )
    workers: int = Field(
        len(_cluster_default("fleet")), ge=1, description="Number of workers (ignored when --fleet is given)."
    )
    fleet: str | None = Field(None, description="GPU mix, e.g. 'a100:2,h100:2' (default: --workers × a100).")
    rate_scale: float = Field(DEFAULT_RATE_SCALE, description="Arrival times are divided by this (2 = twice the load).")
    start_s: float = Field(0.0, description="Start of the trace window, seconds of trace time.")
    duration_s: float | None = Field(None, description="Length of the trace window, seconds of trace time.")
    seed: int = Field(
        _cluster_default("seed"), ge=0, description="Seed of every random stream (arrival spread, jitter)."
    )
    warmup_s: float = Field(
        _cluster_default("warmup_s"), description="Simulate but do not measure arrivals before this, replay time s."
    )
    directory_lag_s: float = Field(
        _cluster_default("directory_lag_s"), description="Delay of KV events to the router's directory, seconds."
    )
    slowdown: list[str] = Field(
        default_factory=list,
        description="Straggler WORKER:SPEED[@T_S]: runs at SPEED × nominal (0.6 = 60 %) from replay time T_S.",
    )
    token_budget: int = Field(
        _cluster_default("token_budget"), ge=1, description="Tokens per continuous-batching step."
    )
    tensor_parallel: int = Field(
        _cluster_default("tensor_parallel"), ge=1, description="GPUs per worker (tensor-parallel degree)."
    )
    profile: list[Path] = Field(
        default_factory=list,
        description="kvcost profile file (repeatable): adds a GPU type named after it that --fleet may name.",
    )
    model: str = Field(
        _cluster_default("model"),
        description=f"Model served by every worker: {', '.join(MODELS.names())}, or a path to a config.json.",
    )
    kv_capacity_blocks: int | None = Field(
        _cluster_default("kv_capacity_blocks"), ge=1, description="KV blocks per worker (default: from GPU memory)."
    )
    gpu_memory_utilization: float = Field(
        _cluster_default("gpu_memory_utilization"),
        description="Share of GPU memory for weights + KV (vLLM default 0.9).",
    )
    jitter_sigma: float = Field(
        _cluster_default("jitter_sigma"), description="σ of the log-normal per-step jitter (ground truth only)."
    )
    eviction_policy: str = Field(
        _cluster_default("eviction_policy"),
        description=f"KV eviction policy of every worker's cache: {', '.join(EVICTION_POLICIES.names())} "
        "(lru = vLLM's and SGLang's; clairvoyant reads the trace's future, an offline reference).",
    )
    count_in_flight: bool = Field(
        True,
        description="Cost-aware routers count prefixes they routed that are not stored yet as reusable.",
    )
    count_promise_survival: bool = Field(
        True,
        description="Cost-aware routers count a queued request's work net of the reuse expected to survive "
        "until its admission, not of its promise (with --count-in-flight; nothing without it).",
    )
    max_share_over_mean: float = Field(
        math.inf,
        ge=0,
        description="Hot-spot skew limit: exclude a worker over (1 + this) / workers of the recent routed "
        "tokens (inf = off).",
    )
    policy_param: list[str] = Field(
        default_factory=list,
        description="A keyword parameter of the routing policy, NAME=VALUE (repeatable): e.g. "
        "duplicate_price_weight=0 ranks cost_aware without its duplicate price.",
    )
    skip_bad_lines: bool = Field(False, description="Skip malformed trace lines and report how many.")
    out: Path | None = Field(
        None,
        description="Output folder (default runs/<UTC timestamp>).",
    )
    db: Path = Field(DEFAULT_LOG_PATH, description="DuckDB log, appended to.")

    @field_validator("eviction_policy")
    @classmethod
    def _registered_eviction_policy(cls, value: str) -> str:
        """A registered eviction policy, checked before any replay starts (``kvcost bench`` calibrates first)."""
        if value not in EVICTION_POLICIES:
            raise ValueError(f"expected one of {', '.join(EVICTION_POLICIES.names())}")
        return value

    @field_validator("policy_param")
    @classmethod
    def _name_value_pairs(cls, value: list[str]) -> list[str]:
        """Every entry NAME=VALUE with a number (:func:`parse_policy_params`), checked before any replay."""
        parse_policy_params(value)
        return value

    @property
    def policy_params(self) -> tuple[tuple[str, float], ...]:
        """``policy_param`` as ``(name, value)`` pairs (``RouterSettings.policy_params``)."""
        return parse_policy_params(self.policy_param)

    def prepare_arguments(self) -> dict[str, object]:
        """Keyword arguments of :func:`kvcost.replay.runner.prepare` (``slowdown`` → ``slowdowns``,
        ``profile`` → ``profiles``, a tuple of path strings, ``policy_param`` → ``policy_params``, pairs)."""
        arguments = self.model_dump()
        arguments["slowdowns"] = tuple(arguments.pop("slowdown"))
        arguments["profiles"] = tuple(str(p) for p in arguments.pop("profile"))
        arguments.pop("policy_param")
        arguments["policy_params"] = self.policy_params
        return arguments


def parse_policy_params(entries: list[str]) -> tuple[tuple[str, float], ...]:
    """``NAME=VALUE`` strings as ``(name, value)`` pairs, in order, e.g. ``["duplicate_price_weight=0"]`` →
    ``(("duplicate_price_weight", 0.0),)``. Whether the policy takes them is checked with the policy
    (:func:`~kvcost.routing.policies.check_policy_params`).

    Raises:
        ValueError: an entry without ``=``, with an empty name, a value that is not a number, or a name
            given twice.
    """
    params: dict[str, float] = {}
    for entry in entries:
        name, _, text = entry.partition("=")
        name = name.strip()
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not name or math.isnan(value):
            expected = "NAME=VALUE with a number, e.g. duplicate_price_weight=0"
            raise ValueError(f"policy_param = {entry!r}, expected {expected}")
        if name in params:
            raise ValueError(f"policy_param {name!r} given twice, expected each parameter once")
        params[name] = value
    return tuple(params.items())
