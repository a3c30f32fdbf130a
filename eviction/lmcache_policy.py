"""kvcost's eviction ranking inside LMCache: a cache policy for LMCache's CPU and disk tiers.

vLLM and SGLang evict their GPU prefix cache with LRU inside the engine, and a
router cannot reach into that. LMCache's storage backends (``LocalCPUBackend``,
``LocalDiskBackend``) instead take their eviction order from a pluggable
policy: a :class:`lmcache.v1.storage_backend.cache_policy.base_policy.BaseCachePolicy`
looked up by name in ``POLICY_MAPPING`` from the ``cache_policy`` setting
(``LMCACHE_CACHE_POLICY``). :class:`KvcostCachePolicy` is such a policy; it
ranks with kvcost's own policies through :class:`~kvcost.eviction.chunks.ChunkRanker`.

Use, in the process that runs LMCache (a vLLM worker with the LMCache
connector), with kvcost installed beside it::

    import kvcost.eviction.lmcache_policy as kv
    kv.register()                        # POLICY_MAPPING["KVCOST"] = KvcostCachePolicy
    # then LMCACHE_CACHE_POLICY=KVCOST, and KVCOST_LMCACHE_* (below) to choose the rule

``register`` must run before LMCache builds its storage backends, e.g. from a
vLLM general plugin (the ``vllm.general_plugins`` entry point group, loaded in
every vLLM process) or a ``sitecustomize`` module.

This module imports LMCache and so only loads where LMCache is installed (it is
not part of kvcost's own environment; ``make lmcache`` builds one, and
``tests/e2e/test_lmcache_policy.py`` drives a real ``LocalCPUBackend`` with it).
Checked against LMCache 0.5.6's interface.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, MutableMapping
from types import SimpleNamespace

from lmcache.v1.storage_backend.cache_policy import POLICY_MAPPING
from lmcache.v1.storage_backend.cache_policy.base_policy import BaseCachePolicy
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from kvcost.core.hardware import StepTimeModel
from kvcost.eviction.base import EvictionContext, deployable_policies, make_eviction_policy
from kvcost.eviction.chunks import DEFAULT_CHAIN_WINDOW_S, DEFAULT_RERANK_INTERVAL_S, ChunkRanker
from kvcost.eviction.prefill import flops_saved_table, prefill_saved_table
from kvcost.models.predictors.analytic import AnalyticTermPredictor

#: The name :func:`register` gives the policy in LMCache's ``POLICY_MAPPING`` (LMCache upper-cases names).
POLICY_NAME = "KVCOST"


class LMCachePolicySettings(BaseSettings):
    """How :class:`KvcostCachePolicy` values a chunk; environment variables ``KVCOST_LMCACHE_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="KVCOST_LMCACHE_", extra="forbid")

    eviction: str = Field("cost_aware", description="kvcost eviction policy ranking the chunks (a registered name)")
    model: str = Field("llama-3-8b", description="model served: a shipped name or a config.json path")
    gpu: str = Field("a100", description="GPU type of the engine whose prefill a hit saves")
    chunk_tokens: int = Field(256, ge=1, description="LMCache's chunk_size: tokens per stored chunk")
    max_depth_chunks: int = Field(512, ge=0, description="deepest tabulated chunk; deeper ones cost as this one")
    horizon_s: float = Field(300.0, gt=0, description="cost_aware's reuse horizon H without a reuse model, s")
    restore_s: float = Field(math.inf, ge=0, description="seconds to bring an evicted chunk back (inf: dropped)")
    chain_window_s: float = Field(DEFAULT_CHAIN_WINDOW_S, gt=0, description="events this close form one chain, s")
    rerank_interval_s: float = Field(DEFAULT_RERANK_INTERVAL_S, gt=0, description="a ranking is reused this long, s")


def ranker_from_settings(settings: LMCachePolicySettings) -> ChunkRanker:
    """A :class:`ChunkRanker` for ``settings``: the chunk's prefill seconds from kvcost's analytic cost
    model of ``settings.model`` on ``settings.gpu`` (:func:`~kvcost.eviction.prefill.prefill_saved_table`,
    a chunk taken as one block of ``chunk_tokens``).

    Raises:
        ValueError: an unknown eviction policy, model or GPU (the message names the field and the choices).
    """
    if settings.eviction not in deployable_policies():
        raise ValueError(f"eviction = {settings.eviction!r}, expected one of {sorted(deployable_policies())}")
    step_model = StepTimeModel.for_hardware(settings.model, settings.gpu)
    saved_s = prefill_saved_table(_AnalyticPrefill(), step_model, settings.chunk_tokens, settings.max_depth_chunks)
    flops = flops_saved_table(step_model, settings.chunk_tokens, settings.max_depth_chunks)
    policy = make_eviction_policy(settings.eviction, EvictionContext(horizon_s=settings.horizon_s))
    return ChunkRanker(
        policy,
        saved_s,
        flops,
        restore_s=settings.restore_s,
        chain_window_s=settings.chain_window_s,
        rerank_interval_s=settings.rerank_interval_s,
    )


class _AnalyticPrefill:
    """The analytic cost model's prefill term in the shape :func:`prefill_saved_table` reads
    (``predict(x).prefill_s``). Not ``TermModelSet.analytic()``: its calibration imports kvcost's
    DuckDB log store, which an engine's environment has no use for."""

    def __init__(self) -> None:
        self._prefill = AnalyticTermPredictor("prefill")

    def predict(self, features) -> SimpleNamespace:
        return SimpleNamespace(prefill_s=self._prefill.predict_many(features))


class KvcostCachePolicy(BaseCachePolicy):
    """LMCache cache policy that evicts in kvcost's order (see the module docstring).

    LMCache builds it with no arguments (``POLICY_MAPPING[name]()``), so it reads
    :class:`LMCachePolicySettings` from the environment; tests pass ``settings``.
    The cache mapping is a plain dict of ``CacheEngineKey → MemoryObj``; a chunk's
    bytes are its ``MemoryObj.get_size()``, and ``can_evict`` False (pinned, in
    use) keeps it.
    """

    def __init__(self, settings: LMCachePolicySettings | None = None) -> None:
        self.settings = settings if settings is not None else LMCachePolicySettings()
        self.ranker = ranker_from_settings(self.settings)

    def init_mutable_mapping(self) -> dict:
        """LMCache's cache mapping: a plain dict (the order lives in the ranker)."""
        return {}

    def update_on_hit(self, key: Hashable, cache_dict: MutableMapping) -> None:
        """A stored chunk was reused."""
        self.ranker.on_hit(key)

    def update_on_put(self, key: Hashable) -> None:
        """A chunk was stored."""
        self.ranker.on_put(key)

    def update_on_force_evict(self, key: Hashable) -> None:
        """A chunk was removed from outside the policy."""
        self.ranker.on_remove(key)

    def get_evict_candidates(self, cache_dict: MutableMapping, num_candidates: int = 1) -> list[Hashable]:
        """Up to ``num_candidates`` evictable chunks, lowest kvcost value first (fewer when fewer can go,
        as LMCache's own policies do)."""
        sizes = _Sizes(cache_dict)
        return self.ranker.candidates(num_candidates, sizes, lambda key: cache_dict[key].can_evict)


class _Sizes:
    """``cache_dict`` read as ``key → bytes`` without copying it (the ranker only tests and reads keys)."""

    def __init__(self, cache_dict: MutableMapping) -> None:
        self._cache = cache_dict

    def __contains__(self, key: object) -> bool:
        return key in self._cache

    def __getitem__(self, key: Hashable) -> float:
        return float(self._cache[key].get_size())


def register(name: str = POLICY_NAME) -> None:
    """Make :class:`KvcostCachePolicy` LMCache's policy ``name`` (``LMCACHE_CACHE_POLICY=<name>``).

    Raises:
        ValueError: ``name`` already names another policy class in LMCache.
    """
    key = name.upper()
    known = POLICY_MAPPING.get(key)
    if known is not None and known is not KvcostCachePolicy:
        raise ValueError(f"name = {name!r}: LMCache already has a policy {key} ({known.__name__})")
    POLICY_MAPPING[key] = KvcostCachePolicy
