"""The settings tables of the command families: which fields of which settings model each command exposes."""

from __future__ import annotations

from kvcost.cli.options import SettingsTable
from kvcost.replay.settings import ReplaySettings
from kvcost.serving.settings import ServiceSettings

#: ``kvcost replay``: every replay setting.
REPLAY = SettingsTable(ReplaySettings)
#: ``kvcost experiment``: every replay setting but the policy's parameters (its arms run several policies).
EXPERIMENT = SettingsTable(ReplaySettings, exclude=("policy_param",))
#: ``kvcost bench``: the trace, seed, the workers' eviction policy, model and tensor-parallel degree (``--gpu`` is
#: the bench's own option) and output folder (the grid fixes sizes and loads).
BENCH = SettingsTable(
    ReplaySettings,
    include=("trace", "seed", "eviction_policy", "model", "tensor_parallel", "policy_param", "out"),
    helps={
        "out": "Output folder (default runs/bench-<UTC timestamp>; with --sensitivity "
        "runs/sensitivity-<UTC timestamp>).",
        "policy_param": "A keyword parameter of every benched policy, NAME=VALUE (repeatable): e.g. "
        "duplicate_price_weight=0 with --policies cost_aware.",
    },
)
#: ``kvcost eviction-study``: the trace window, load, seed and output folder (the study fixes the cluster).
EVICTION_STUDY = SettingsTable(
    ReplaySettings,
    include=("trace", "duration_s", "rate_scale", "seed", "out"),
    helps={"out": "Output folder (default runs/eviction-<UTC timestamp>)."},
)
#: ``kvcost serve``, in the order of its ``--help``. ``mlflow_uri`` has its own options (``--mlflow-uri``,
#: ``--analytic-only``); the limits and timeouts are set through ``KVCOST_*`` environment variables only.
SERVE = SettingsTable(
    ServiceSettings,
    include=(
        "host",
        "port",
        "db_path",
        "token_file",
        "insecure",
        "protect_reads",
        "policy",
        "model",
        "tensor_parallel",
        "profile",
        "gpu_default",
        "block_size_tokens",
        "max_body_bytes",
        "kv_events",
        "served_model_name",
        "revision",
        "kv_layout",
        "hash_algorithm",
        "hash_seed",
        "hash_extra_keys",
        "lora_modules",
        "scrape",
        "scrape_interval_s",
        "tiers",
        "reuse_model_dir",
        "engines",
        "tokenizer",
        "engine_connect_timeout_s",
        "engine_read_timeout_s",
        "routed_ttl_s",
        "heavy_workers",
        "heavy_body_bytes",
        "heavy_queue_limit",
        "max_directory_blocks_per_worker",
    ),
    renames={
        "db_path": "db",
        "gpu_default": "gpu",
        "hash_algorithm": "prefix_caching_hash_algo",
        "engines": "engine",
    },
)
