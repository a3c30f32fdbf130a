"""The ``aibrix_prefix_cache`` baseline: AIBrix's ``prefix-cache`` routing algorithm (docs/architecture.md §7).

Sources read (vllm-project/aibrix):

- ``pkg/plugins/gateway/algorithms/prefix_cache.go``: ``routeOriginal`` (the
  local-indexer path), ``getTargetPodOnLoadImbalance``, ``getTargetPodFromMatchedPods``,
  ``selectPodWithLeastRequestCount``; code defaults
  ``defaultPodRunningRequestImbalanceAbsCount = 8``, ``defaultStandardDeviationFactor = 1``.
- ``pkg/plugins/gateway/algorithms/README.md`` (pseudo-code and configuration) and
  the Helm chart values (``gatewayPlugin.container.envs``), which ship
  ``AIBRIX_PREFIX_CACHE_POD_RUNNING_REQUEST_IMBALANCE_ABS_COUNT=16``,
  ``AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR=2``,
  ``AIBRIX_PREFIX_CACHE_BLOCK_SIZE=128``, ``AIBRIX_PREFIX_CACHE_TOKENIZER_TYPE=character``.
- ``pkg/utils/prefixcacheindexer/hash.go``: ``PrefixHashTable`` (``MatchPrefix``,
  ``AddPrefix``; ``defaultPrefixCacheBlockNumber = 200000``, eviction every 1 s of
  blocks older than ``defaultPrefixCacheEvictionDurationInMins = 20``).
- ``pkg/utils/lrustore/lru_store.go``: the LRU store (``Put`` refreshes, ``Get`` does
  not; capacity evicts the least recently put block; TTL sweep ``now − put > ttl``).
- The gateway's ``getRequestCounts`` / ``RealtimeNumRequestsRunning``: requests the
  gateway routed to a pod and has not seen complete.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from kvcost.routing.policies.base import ROUTER_POLICIES, PolicyContext, RouterPolicy, random_among_ties

#: Running-request spread above which load is imbalanced: ``..._IMBALANCE_ABS_COUNT`` as
#: shipped in the Helm chart and README (the Go fallback default is 8).
DEFAULT_IMBALANCE_ABS_COUNT = 16
#: Standard deviations above the mean a matched pod may run: ``..._STANDARD_DEVIATION_FACTOR``
#: as shipped in the Helm chart and README (the Go fallback default is 1).
DEFAULT_STANDARD_DEVIATION_FACTOR = 2.0
#: Seconds a block stays in the index after it was last added: ``AIBRIX_PREFIX_CACHE_EVICTION_DURATION_MINS`` = 20.
DEFAULT_BLOCK_TTL_S = 20 * 60.0
#: AIBrix block: 128 characters (shipped ``AIBRIX_PREFIX_CACHE_BLOCK_SIZE`` with the character tokenizer).
AIBRIX_BLOCK_CHARS = 128
#: Characters per token used to convert character sizes to tokens (assumption: ~4 for English BPE text).
CHARS_PER_TOKEN = 4
#: Index capacity: ``AIBRIX_PREFIX_CACHE_BLOCK_NUMBER`` = 200 000 blocks × 128 characters / 4 = 6 400 000 tokens.
DEFAULT_INDEX_CAPACITY_TOKENS = 200_000 * AIBRIX_BLOCK_CHARS // CHARS_PER_TOKEN
#: Seed of the policy's generator for AIBrix's random tie-breaks (kvcost's choice: AIBrix
#: uses Go's global ``math/rand``; a fixed seed keeps replays reproducible).
DEFAULT_SEED = 0


class PrefixHashTable:
    """AIBrix's prefix index: block hash → pods that were sent it, in one LRU store with a TTL.

    Unlike :class:`~kvcost.routing.routed_index.RoutedPrefixIndex` (per-worker LRU
    sets), an entry is per *block*: adding a block for any pod refreshes the entry
    for every pod listed on it, and the capacity counts distinct blocks over all
    pods, as in AIBrix's ``PrefixHashTable`` on an ``LRUStore``.

    Example:
        >>> table = PrefixHashTable(capacity_blocks=10, ttl_s=60.0)
        >>> table.add([1, 2], worker_id=7, now_s=0.0)
        >>> table.match([1, 2, 3], [7, 8])
        [2, 0]

    Thread safety: not thread-safe; one owner.
    """

    def __init__(self, capacity_blocks: int, ttl_s: float) -> None:
        self.capacity_blocks = capacity_blocks
        self.ttl_s = ttl_s
        self._entries: OrderedDict[int, tuple[float, set[int]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, block_hashes: Sequence[int], worker_id: int, now_s: float) -> None:
        """``AddPrefix``: put each block (in order) with ``worker_id`` added; evict the LRU block past capacity."""
        for block_hash in block_hashes:
            entry = self._entries.pop(block_hash, None)
            workers = entry[1] if entry is not None else set()
            workers.add(worker_id)
            self._entries[block_hash] = (now_s, workers)
            if len(self._entries) > self.capacity_blocks:
                self._entries.popitem(last=False)

    def expire(self, now_s: float) -> int:
        """The TTL sweep: drop blocks put more than ``ttl_s`` before ``now_s``. Returns blocks dropped."""
        dropped = 0
        while self._entries:
            put_s, _ = next(iter(self._entries.values()))
            if now_s - put_s <= self.ttl_s:
                break
            self._entries.popitem(last=False)
            dropped += 1
        return dropped

    def match(self, block_hashes: Sequence[int], worker_ids: Sequence[int]) -> list[int]:
        """``MatchPrefix``: leading blocks each worker holds, same order as ``worker_ids``."""
        matched = dict.fromkeys(worker_ids, 0)
        alive = set(worker_ids)
        for depth, block_hash in enumerate(block_hashes, start=1):
            entry = self._entries.get(block_hash)
            alive = alive & entry[1] if entry is not None else set()
            if not alive:
                break
            for worker_id in alive:
                matched[worker_id] = depth
        return [matched[w] for w in worker_ids]


def running_requests(ctx: PolicyContext) -> np.ndarray:
    """Per-candidate requests in flight at the pod (waiting + running), int64 ``(n,)``: AIBrix's request count."""
    return np.array([s.waiting_requests + s.running_requests for s in ctx.snapshots], dtype=np.int64)


@ROUTER_POLICIES.register("aibrix_prefix_cache")
class AIBrixPrefixCachePolicy(RouterPolicy):
    """AIBrix ``prefix-cache``: least-request when imbalanced, else best prefix match within mean + kσ.

    Source: vllm-project/aibrix ``pkg/plugins/gateway/algorithms/prefix_cache.go`` and
    ``pkg/utils/prefixcacheindexer/hash.go`` (see the module docstring for every file read).

    Rule (load = running requests the gateway counts per pod):

    1. ``max − min > imbalance_abs_count`` → least-request: a pod with the fewest
       requests (random among ties).
    2. Otherwise match the request's blocks against the index; matched pods get
       ``match % = matched blocks × 100 // request blocks`` (integer, as in Go).
       Shuffle them, stable-sort by match % descending then requests ascending, and
       take the first with ``requests ≤ mean + standard_deviation_factor × σ``
       (mean and sample σ of all pods' requests).
    3. No matched pod, or none within the limit → least-request.
    4. The request's blocks are added to the index for the chosen pod in every
       branch (:meth:`on_routed`).

    Defaults: imbalance_abs_count 16 and standard_deviation_factor 2 as shipped in
    AIBrix's Helm chart values and documented in algorithms/README.md (the Go
    fallbacks when the environment variables are unset are 8 and 1); block TTL
    20 min (hash.go); index capacity 200 000 blocks of 128 characters (hash.go,
    Helm chart) = 6.4 M tokens at :data:`CHARS_PER_TOKEN` = 4; ``seed`` 0.

    Discrepancies, stated: docs/architecture.md §7's 16 and 2σ are the shipped configuration,
    not the code defaults (8, 1σ). AIBrix ``main`` (after v0.5) replaced rule 1 by a
    load gate — if ``max > 2.0 × (mean + 1)`` and ``max − min ≥ 8``, prefix matching
    is restricted to the least-loaded pods — which this class does not implement.
    The older ``getTargetPodOnLoadImbalance`` computes max with an ``else if`` that
    can miss the maximum; this class uses the true max − min (the documented intent).

    Approximations:

    - Load = ``waiting_requests + running_requests``: AIBrix's
      ``RealtimeNumRequestsRunning`` counts requests routed and not completed,
      whether queued or running in the engine.
    - Blocks are the namespace's KV blocks (chained hashes of
      ``block_size_tokens`` tokens) instead of AIBrix's 128-character blocks of raw
      text; match % is over the request's full blocks, as AIBrix's is over its
      full blocks.
    - The TTL sweep runs at every decision instead of every second (a block can
      outlive its TTL by up to 1 s in AIBrix).
    - Candidates are all workers: kvcost's hot-spot skew limit (``ctx.allowed``)
      is not part of AIBrix.

    Args:
        imbalance_abs_count: ≥ 0 requests.
        standard_deviation_factor: ≥ 0.
        block_ttl_s: > 0 seconds.
        index_capacity_tokens: ≥ 1 token (converted to blocks of the request's namespace).
        seed: seed of the policy's ``numpy.random.Generator``.

    Raises:
        ValueError: an argument out of range (the message names it).

    Thread safety: not thread-safe (the index and the generator change on every decision).
    """

    name = "aibrix_prefix_cache"

    def __init__(
        self,
        *,
        imbalance_abs_count: int = DEFAULT_IMBALANCE_ABS_COUNT,
        standard_deviation_factor: float = DEFAULT_STANDARD_DEVIATION_FACTOR,
        block_ttl_s: float = DEFAULT_BLOCK_TTL_S,
        index_capacity_tokens: int = DEFAULT_INDEX_CAPACITY_TOKENS,
        seed: int = DEFAULT_SEED,
    ) -> None:
        if imbalance_abs_count < 0:
            raise ValueError(f"imbalance_abs_count = {imbalance_abs_count}, expected ≥ 0")
        if not standard_deviation_factor >= 0:
            raise ValueError(f"standard_deviation_factor = {standard_deviation_factor}, expected ≥ 0")
        if not block_ttl_s > 0:
            raise ValueError(f"block_ttl_s = {block_ttl_s}, expected > 0")
        if index_capacity_tokens < 1:
            raise ValueError(f"index_capacity_tokens = {index_capacity_tokens}, expected ≥ 1")
        self.imbalance_abs_count = imbalance_abs_count
        self.standard_deviation_factor = standard_deviation_factor
        self.block_ttl_s = block_ttl_s
        self.index_capacity_tokens = index_capacity_tokens
        self.index: PrefixHashTable | None = None
        super().__init__(seed=seed)
        self._rng = np.random.default_rng(seed)

    def _index_for(self, block_size_tokens: int) -> PrefixHashTable:
        if self.index is None:
            capacity_blocks = max(1, self.index_capacity_tokens // block_size_tokens)
            self.index = PrefixHashTable(capacity_blocks, self.block_ttl_s)
        return self.index

    def _least_request(self, load: np.ndarray) -> int:
        return random_among_ties(load, self._rng)[0]

    def choose(self, ctx: PolicyContext) -> tuple[int, str]:
        """Least-request if imbalanced; else the best-matching pod within mean + kσ; else least-request."""
        request = ctx.request
        index_table = self._index_for(request.namespace.block_size_tokens)
        index_table.expire(ctx.now_s)
        load = running_requests(ctx)
        worker_ids = [s.worker_id for s in ctx.snapshots]
        high, low = int(load.max()), int(load.min())
        if high - low > self.imbalance_abs_count:
            index = self._least_request(load)
            return index, (
                f"imbalanced: max {high} − min {low} running > {self.imbalance_abs_count} → "
                f"least-request worker {worker_ids[index]} ({load[index]} running)"
            )
        n_blocks = len(request.block_hashes)
        matched_blocks = np.array(index_table.match(request.block_hashes, worker_ids), dtype=np.int64)
        matched = np.flatnonzero(matched_blocks > 0)
        if matched.size == 0:
            index = self._least_request(load)
            return index, f"no prefix match → least-request worker {worker_ids[index]} ({load[index]} running)"
        percent = matched_blocks * 100 // max(n_blocks, 1)
        mean = float(load.mean())
        sigma = float(load.std(ddof=1)) if load.size > 1 else math.nan
        limit = mean + self.standard_deviation_factor * sigma
        order = sorted(self._rng.permutation(matched).tolist(), key=lambda i: (-percent[i], load[i]))
        bound = f"mean {mean:.1f} + {self.standard_deviation_factor:g}σ {sigma:.1f} = {limit:.1f}"
        for rank, index in enumerate(order):
            if load[index] <= limit:
                skipped = f"; {rank} better-matched pod(s) over the limit" if rank else ""
                return index, (
                    f"prefix match {percent[index]}% → worker {worker_ids[index]} "
                    f"({load[index]} running ≤ {bound}){skipped}"
                )
        index = self._least_request(load)
        return index, (
            f"prefix match skipped: {len(order)} matched pod(s) over {bound} → "
            f"least-request worker {worker_ids[index]} ({load[index]} running)"
        )

    def on_routed(self, ctx: PolicyContext, index: int) -> None:
        """``AddPrefix``: record the request's blocks for the chosen pod."""
        table = self._index_for(ctx.request.namespace.block_size_tokens)
        table.add(ctx.request.block_hashes, ctx.snapshots[index].worker_id, ctx.now_s)
