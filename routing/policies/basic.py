"""kvcost's own policies: ``round_robin``, ``least_loaded``, ``cost_aware`` and ``learned_cost_aware``."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence

import numpy as np

from kvcost.calibration.drift import SPEED_RATIO_BAND
from kvcost.core.types import blocks_to_allocate
from kvcost.features.spec import FEATURE_INDEX
from kvcost.routing.policies.base import DEFAULT_SEED, ROUTER_POLICIES, PolicyContext, RouterPolicy, argmin_stable
from kvcost.routing.policies.dynamo import DynamoKvPolicy


@ROUTER_POLICIES.register("round_robin")
class RoundRobinPolicy(RouterPolicy):
    """Cycle through candidates in order, ignoring load and cache."""

    name = "round_robin"

    def __init__(self, *, seed: int = DEFAULT_SEED) -> None:
        super().__init__(seed=seed)
        self._next = 0

    def choose(self, ctx: PolicyContext) -> tuple[int, str]:
        """Next candidate in turn."""
        index = self._next % len(ctx.snapshots)
        self._next += 1
        return index, "round robin"


@ROUTER_POLICIES.register("least_loaded")
class LeastLoadedPolicy(RouterPolicy):
    """Least outstanding work in tokens: queued prefill tokens + decode work (not request count)."""

    name = "least_loaded"

    def choose(self, ctx: PolicyContext) -> tuple[int, str]:
        """Candidate with the fewest outstanding tokens; lowest worker index on ties."""
        index = argmin_stable(ctx.load_tokens)
        return index, f"least outstanding work {ctx.load_tokens[index]:.0f} tokens"


def memory_pressure(ctx: PolicyContext) -> np.ndarray:
    """Each candidate's KV demand against its capacity, float64 ``(n,)`` in [0, 1].

    Pressure = ``kv_usage`` (the fraction of blocks held by running requests) +
    ``waiting_prompt_blocks`` (the blocks admitting the requests not yet admitted takes) ÷
    ``kv_capacity_blocks``; where the capacity is unknown (0), ``kv_usage`` alone. Idle
    cached blocks are not demand: they are what a new allocation evicts once the free
    blocks are gone.
    """
    usage = np.array([s.kv_usage for s in ctx.snapshots], dtype=np.float64)
    capacity = np.array([s.kv_capacity_blocks for s in ctx.snapshots], dtype=np.float64)
    waiting = np.array([s.waiting_prompt_blocks for s in ctx.snapshots], dtype=np.float64)
    queued = np.divide(waiting, capacity, out=np.zeros_like(waiting), where=capacity > 0)
    return np.clip(usage + queued, 0.0, 1.0)


def duplicate_price_s(ctx: PolicyContext) -> np.ndarray:
    """What routing the request to each candidate leaves behind, seconds ``(n,)``, ≥ 0.

    Price = memory pressure × prefill seconds of the prefix tokens another candidate
    holds and this one does not (``max(reusable) − reusable``, at this candidate's
    predicted prefill seconds per uncached token). Sending a request where its prefix
    family lives keeps one copy of the prefix; sending it elsewhere stores a second copy.
    With free memory the copy costs nothing later (pressure ≈ 0). Under pressure it
    displaces about as many cached blocks, and those are worth about what the copy
    would cost to recompute: prefixes cached on the same worker by the same workload,
    priced by the same step model. The price is then a recompute the fleet will likely
    pay later. The holder pays 0, so a request leaves its family only when another
    worker's TTFT is lower by more than that. It takes no fitted constant: pressure and
    prefill seconds come from each snapshot and the cost model, so it holds across
    workloads and fleets (the issue-13 grid of 5 workloads × 2 fleet sizes × 3 loads,
    seeds 0 and 1: ``docs/routing-unseen-workloads.md``, with its ×0.5 / ×2 sweep).
    """
    return memory_pressure(ctx) * wasted_prefill_s(ctx)


def wasted_prefill_s(ctx: PolicyContext) -> np.ndarray:
    """Prefill seconds each candidate spends on prefix tokens another candidate holds, float64 ``(n,)``, ≥ 0:
    ``(max(reusable) − reusable_j)`` × j's predicted prefill seconds per uncached token (0 on the holder)."""
    reuse = ctx.reusable_tokens.astype(np.float64)
    uncached = np.maximum(1.0, ctx.request.input_tokens - reuse)
    return (reuse.max() - reuse) * ctx.predictions.prefill_s / uncached


def memory_hold_price_s(ctx: PolicyContext, hold_tokens: float | None = None) -> np.ndarray:
    """What the KV memory a request holds costs the requests queued behind it, seconds ``(n,)``, ≥ 0.

    Price on candidate i = memory pressure × held blocks × hold seconds ÷ KV capacity × waiting:

    * **held blocks**: the fleet's typical waiting request's new blocks, plus the blocks this
      choice adds: ``typical + new_i − min_j new_j``, where ``new_i`` is what the request
      allocates at admission on candidate j (:func:`~kvcost.core.types.blocks_to_allocate`, its
      prompt less the prefix j holds) and ``typical`` is Σ ``waiting_prompt_blocks`` ÷ Σ waiting
      requests over the candidates. The ``min_j new_j`` blocks the request allocates wherever it
      goes are priced as a typical request's, so the price ranks the workers in the same order
      for a short request and a long one; the blocks a move off the prefix holder adds (a second
      copy) are priced at their own count;
    * **hold seconds**: ``hold_tokens`` decode steps at i's decode step time with the request in
      the batch (``step_s(running + 1, 0, decode context + input)``). The requests behind it wait
      for blocks that running requests release; by the time they wait, this request is one of
      those running requests, with about a running request's remaining output left. None (the
      default) takes the router's online estimate of it from the output lengths observed so far
      (``ctx.remaining_decode_tokens``): it differs
      between workloads by more than 5× (50 to 262 tokens on the repository's traces), and a
      fixed figure would scale the price by that much;
    * **÷ capacity**: a worker whose memory binds admits requests as blocks come free. It has
      ``capacity`` block-seconds a second, so holding B blocks for T seconds takes
      ``B × T ÷ capacity`` seconds of its admission capacity. Each request admitted after this
      one is delayed that long;
    * **waiting**: how many requests that delay reaches. In a backlog that persists, the requests
      arriving behind a request during its wait are as many as it found waiting (Little's law,
      L = λW), so the waiting count now stands for them;
    * **memory pressure** (:func:`memory_pressure`): how close the worker is to the point where
      memory binds. With free blocks, holding them delays no one.

    Why it is needed: the queue term prices the prefill queued ahead of a request, not the
    admission stall when KV memory is full, so in a burst ``cost_aware`` kept choosing workers
    with no free block (kvcost issue 13; the measurements are in
    ``docs/routing-unseen-workloads.md``, "The memory a request holds"). Putting the stall into
    the queue estimate instead, even from the decoders' true remaining output, sends the request
    off its prefix holder to store a second copy elsewhere. Pricing the memory the request
    takes does the opposite. A request that brings its own prefix costs many blocks, one that
    finds it costs a few, so families stay where their prefix is and more decoders fit in the
    same memory.

    Why the unavoidable blocks are priced as a typical request's, not the request's own: a price
    proportional to the request's size, times a per-worker factor that ranks workers otherwise
    than the predicted queue does (the waiting count, or the waiting blocks), makes long and short
    requests prefer different workers, and the router sorts them by size. On the bundled Azure
    traces (no prefix reuse) the own-size price put up to 55 % of the requests on one worker and
    lost 5 of 6 cells to the best anchor, by 3–18 %. Priced as a typical request's, no worker takes
    over 29 %, and the cells are at most 1 % over the best anchor. A sort by size is no property of
    one trace: any fleet whose prompt lengths vary can show it. What it costs, on three seeds: the
    README's heterogeneous fleet and ``make demo`` are about 5 % higher in P99. There the P99
    requests are 100k-token prompts, which the own-size price kept off crowded workers
    (``docs/routing-sensitivity.md``, "The memory price without the sort by size").

    Why it should hold on other workloads: nothing in it is fitted. Blocks, capacity, pressure,
    the waiting counts and the step time come from each snapshot and the GPU type's profile. The
    hold is the one stated assumption. It is zero wherever memory is free or nothing waits, so
    light load routes as before.

    Raises:
        KeyError: a candidate whose price is not zero has a GPU type without a step model in
            ``ctx.step_models``.
    """
    request = ctx.request
    block_size = request.namespace.block_size_tokens
    hold_tokens = ctx.remaining_decode_tokens if hold_tokens is None else hold_tokens
    price = np.zeros(len(ctx.snapshots))
    waiting_counts = [s.waiting_requests for s in ctx.snapshots]
    waiting = sum(waiting_counts)
    if waiting == 0:
        return price
    pressure = memory_pressure(ctx).tolist()
    typical_blocks = sum(s.waiting_prompt_blocks for s in ctx.snapshots) / waiting
    new_blocks = [blocks_to_allocate(request.input_tokens, reuse, block_size) for reuse in ctx.reusable_tokens.tolist()]
    fewest_blocks = min(new_blocks)
    for i, (s, n_waiting) in enumerate(zip(ctx.snapshots, waiting_counts, strict=True)):
        if s.kv_capacity_blocks <= 0 or n_waiting == 0 or pressure[i] == 0:
            continue
        batch_context = s.decode_context_tokens + request.input_tokens
        step_s = ctx.step_models[s.gpu].step_s(s.running_requests + 1, 0.0, batch_context)
        held_blocks = typical_blocks + new_blocks[i] - fewest_blocks
        price[i] = pressure[i] * held_blocks * hold_tokens * step_s / s.kv_capacity_blocks * n_waiting
    return price


class RecentRoutes:
    """The router's last ``window`` decisions: when, to which worker, and the block hashes each carried.

    :func:`arrival_delay_price_s` reads from it the rate at which requests have been sent to each
    worker and how many recent requests carried a given block (a prefix many requests share). The
    window of 64 is the router's skew window's default (``RouterSettings.skew_window_requests``), not
    tuned: about a second of decisions in a burst, a minute at light load. The service's stateless
    scorer keeps its own, fed by the requests it scores.

    Thread safety: not thread-safe; one owner (a policy instance).

    Raises:
        ValueError: ``window`` not an integer ≥ 2.
    """

    def __init__(self, window: int = 64) -> None:
        if not (type(window) is int and window >= 2):
            raise ValueError(f"window = {window!r}, expected an integer ≥ 2")
        self._routes: deque[tuple[float, int, frozenset[int]]] = deque()
        self._window = window
        self._carriers: Counter[int] = Counter()
        self._sent: Counter[int] = Counter()  # records per worker

    def add(self, now_s: float, worker_id: int, block_hashes: Sequence[int]) -> None:
        """Record a request with ``block_hashes`` sent to ``worker_id`` at ``now_s`` (seconds, the caller's
        clock); the oldest record leaves once there are more than ``window``."""
        blocks = frozenset(block_hashes)
        self._routes.append((now_s, worker_id, blocks))
        self._carriers.update(blocks)
        self._sent[worker_id] += 1
        if len(self._routes) > self._window:
            _, old_worker, old = self._routes.popleft()
            self._sent[old_worker] -= 1
            self._carriers.subtract(old)
            for block_hash in old:
                if not self._carriers[block_hash]:
                    del self._carriers[block_hash]

    def rates_per_s(self, worker_ids: Sequence[int], now_s: float) -> np.ndarray:
        """Requests sent to each worker per second over the records, float64 ``(n,)``; zeros with fewer
        than two records or no time between the oldest and ``now_s``."""
        span_s = now_s - self._routes[0][0] if len(self._routes) >= 2 else 0.0
        if span_s <= 0:
            return np.zeros(len(worker_ids))
        return np.array([self._sent[w] for w in worker_ids], dtype=np.float64) / span_s

    def carriers(self, block_hash: int) -> int:
        """How many of the recorded requests carried ``block_hash``."""
        return self._carriers.get(block_hash, 0)


def arrival_delay_price_s(ctx: PolicyContext, recent: RecentRoutes) -> np.ndarray:
    """What a move's recompute costs the requests that arrive at its worker during it, seconds ``(n,)``, ≥ 0.

    Price on candidate j = λ_j × W_j² ÷ 2 ÷ (1 + carriers):

    * **W_j**, the wasted prefill (:func:`wasted_prefill_s`): the prefix tokens another candidate
      holds and j does not, at j's predicted prefill seconds per uncached token. The rest of the
      request's prefill is work the fleet does wherever it goes;
    * **λ_j**: the rate at which the router has been sending requests to j (its last decisions,
      :class:`RecentRoutes`). Requests keep arriving at j while it recomputes; work W added to a
      worker delays each one that arrives during it by W ÷ 2 on average (uniform arrivals over
      the interval), and λ_j W of them arrive: λ_j W² ÷ 2 in all. The M/G/1 busy-period factor
      1 ÷ (1 − ρ), by which those delays spread to later arrivals, is left out: it is unbounded
      in an overload, where the price would then keep every request on its holder whatever the
      holder's queue (the tail then grows, ``docs/routing-unseen-workloads.md``, stop 28);
    * **÷ (1 + carriers)**: the recent requests that carried the request's deepest held block. A
      copy of a prefix many requests share (a system prompt, tool definitions) is used again by
      the requests that follow, which can then be balanced without a recompute; a conversation's
      own history is carried by one request a turn, and moving it only costs.

    Why it is needed: a request moved off its prefix holder at light load gains its own TTFT a
    few hundredths of a second, and its recompute takes the target for tenths; the queue term
    sees no cost while nothing waits there. On ``gen:multi-turn`` at 4 workers those moves were
    all of ``cost_aware``'s extra prefill against ``preble_e2`` (132,608 tokens, +4.5 %), still
    queued when the burst that made the P99 came (``docs/routing-unseen-workloads.md``, "A price
    for the arrivals that a move's recompute delays").

    Why it should hold on other workloads: nothing in it is fitted. The rates and carriers come
    from the router's own decisions, W from the cost model; the price is 0 on the holder, for a
    request no worker holds a prefix of, and where nothing is sent to the target.
    """
    most = int(ctx.reusable_tokens.max())
    if most <= 0:
        return np.zeros(len(ctx.reusable_tokens))
    wasted_s = wasted_prefill_s(ctx)
    rates = recent.rates_per_s([s.worker_id for s in ctx.snapshots], ctx.now_s)
    hashes = ctx.request.block_hashes
    depth = min(len(hashes), most // ctx.request.namespace.block_size_tokens)
    carriers = recent.carriers(hashes[depth - 1]) if depth else 0
    return rates * wasted_s**2 / 2.0 / (1 + carriers)


def kv_wait_near_ties(ctx: PolicyContext, score_s: np.ndarray, index: int) -> np.ndarray:
    """The allowed candidates that the KV wait's uncertainty cannot tell from ``index``, int64 indices, sorted.

    Candidate j is a near tie of the best-scored ``index`` when ``score_j − score_index ≤ √(σ_j² + σ_index²)``,
    σ the standard deviation of each one's KV-wait estimate (``ctx.kv_wait_sd_s``, the waits taken as
    independent): one standard deviation of the difference. Only ``index`` itself where no candidate has
    a spread (no KV deficit anywhere, or the caller gave none), so a worker whose memory is not short is
    ranked as before.

    Raises:
        ValueError: ``score_s`` or ``ctx.kv_wait_sd_s`` not of one value per candidate.
    """
    spread = ctx.kv_wait_sd_s
    if spread is None or not spread.any():
        return np.array([index])
    if not (len(score_s) == len(spread) == len(ctx.snapshots)):
        raise ValueError(
            f"score_s has {len(score_s)} and kv_wait_sd_s {len(spread)} values, expected one per candidate "
            f"({len(ctx.snapshots)})"
        )
    band = np.sqrt(spread**2 + spread[index] ** 2)
    return np.flatnonzero(ctx.allowed & (score_s - score_s[index] <= band))


def prefill_s_per_token(ctx: PolicyContext) -> np.ndarray:
    """Each candidate's prefill seconds per token, float64 ``(n,)``, > 0.

    The GPU type's profile at a full chunk (``prefill_alone_s(token_budget) ÷ token_budget`` of
    ``ctx.step_models[gpu]``), times the worker's last step measured ÷ its profile's time (the
    ``recent_step_ratio`` feature) where that ratio lies outside the drift monitor's straggler band
    ``[1 / SPEED_RATIO_BAND, SPEED_RATIO_BAND]`` (:mod:`kvcost.calibration.drift`), 1 inside it or without
    feature rows. Why the band: one step's ratio carries its jitter (the replay's σ is 5 %, log-normal),
    which would break the ties of alike workers at random; a straggler (``--slowdown 0.6``: 1.67) is far
    outside it, and a GPU type whose profile is off moves all its workers alike.

    Raises:
        ValueError: a candidate's GPU type has no step model in ``ctx.step_models``.
    """
    per_token = np.empty(len(ctx.snapshots))
    for i, snapshot in enumerate(ctx.snapshots):
        model = ctx.step_models.get(snapshot.gpu)
        if model is None:
            raise ValueError(f"gpu = {snapshot.gpu!r} of worker {snapshot.worker_id} has no step model in step_models")
        per_token[i] = model.prefill_alone_s(model.token_budget) / model.token_budget
    if ctx.features is None:
        return per_token
    ratio = ctx.features[: len(per_token), FEATURE_INDEX["recent_step_ratio"]]
    straggling = (ratio > SPEED_RATIO_BAND) | (ratio < 1.0 / SPEED_RATIO_BAND)
    return per_token * np.where(straggling, ratio, 1.0)


@ROUTER_POLICIES.register("cost_aware")
class CostAwarePolicy(RouterPolicy):
    """Lowest predicted TTFT on the critical path plus what the choice leaves behind, among workers
    within the hot-spot skew limit.

    Weighs cache reuse (shorter prefill) against load (longer queue) through the
    predicted terms, as in docs/architecture.md §1's hot/cold example, and adds three prices of
    what the choice does to other requests: duplicating a prefix another worker holds
    (:func:`duplicate_price_s`), holding KV memory on a worker whose memory binds
    (:func:`memory_hold_price_s`), and the recompute of a held prefix delaying the requests that
    arrive at the target during it (:func:`arrival_delay_price_s`, from the policy's
    :class:`RecentRoutes`).

    Args:
        seed: unused (ties go to the less loaded, then the lower index).
        duplicate_price_weight: factor on :func:`duplicate_price_s` (≥ 0; 1 by default).
        memory_price_weight: factor on :func:`memory_hold_price_s` (≥ 0; 1 by default).
        arrival_price_weight: factor on :func:`arrival_delay_price_s` (≥ 0; 1 by default).
            All three at 0 rank by the predicted TTFT alone.
        hold_tokens: the decode steps :func:`memory_hold_price_s` counts the blocks as held,
            ≥ 0; None (the default) = the router's online estimate of a decoder's remaining
            output (``PolicyContext.remaining_decode_tokens``).

    Raises:
        ValueError: a negative or NaN weight or ``hold_tokens`` (the message names it).
    """

    name = "cost_aware"
    counts_in_flight = True

    def __init__(
        self,
        *,
        seed: int = DEFAULT_SEED,
        duplicate_price_weight: float = 1.0,
        memory_price_weight: float = 1.0,
        arrival_price_weight: float = 1.0,
        hold_tokens: float | None = None,
    ) -> None:
        super().__init__(seed=seed)
        for name, value in (
            ("duplicate_price_weight", duplicate_price_weight),
            ("memory_price_weight", memory_price_weight),
            ("arrival_price_weight", arrival_price_weight),
            ("hold_tokens", 0.0 if hold_tokens is None else hold_tokens),
        ):
            if not value >= 0:
                raise ValueError(f"{name} = {value}, expected a number ≥ 0")
        self.duplicate_price_weight = duplicate_price_weight
        self.memory_price_weight = memory_price_weight
        self.arrival_price_weight = arrival_price_weight
        self.hold_tokens = hold_tokens
        self.recent = RecentRoutes()
        self.by_blocks = DynamoKvPolicy()

    def price_s(self, ctx: PolicyContext) -> np.ndarray:
        """What each choice costs other requests, seconds ``(n,)``: the weighted sum of
        :func:`duplicate_price_s`, :func:`memory_hold_price_s` and :func:`arrival_delay_price_s`
        (terms at weight 0 are skipped)."""
        price = np.zeros(len(ctx.snapshots))
        if self.duplicate_price_weight:
            price += self.duplicate_price_weight * duplicate_price_s(ctx)
        if self.memory_price_weight:
            price += self.memory_price_weight * memory_hold_price_s(ctx, self.hold_tokens)
        if self.arrival_price_weight:
            price += self.arrival_price_weight * arrival_delay_price_s(ctx, self.recent)
        return price

    def on_routed(self, ctx: PolicyContext, index: int) -> None:
        """Record the decision in :attr:`recent` (the arrival price's rates and carriers)."""
        self.recent.add(ctx.now_s, ctx.snapshots[index].worker_id, ctx.request.block_hashes)

    def score_s(self, ctx: PolicyContext) -> np.ndarray:
        """What each candidate is ranked by, seconds ``(n,)``: the composed predicted terms plus
        :meth:`price_s`."""
        return ctx.predictions.ttft_s + self.price_s(ctx)

    def block_cost_s(self, ctx: PolicyContext) -> np.ndarray:
        """Dynamo's block cost of each candidate in that worker's prefill seconds, float64 ``(n,)``:
        ``cost_blocks`` (:meth:`~kvcost.routing.policies.dynamo.DynamoKvPolicy.costs`) × block size ×
        :func:`prefill_s_per_token`. Dynamo counts blocks, which ranks alike workers; on a fleet of mixed
        GPU types, or with a straggler whose measured steps leave the drift band, a block takes each worker
        its own time. On a fleet of one GPU type without a straggler every worker's factor is the same, so
        the order is Dynamo's.

        Raises:
            ValueError: as :func:`prefill_s_per_token` and ``DynamoKvPolicy.costs``.
        """
        block_size = ctx.request.namespace.block_size_tokens
        return self.by_blocks.costs(ctx).cost_blocks * block_size * prefill_s_per_token(ctx)

    def choose(self, ctx: PolicyContext) -> tuple[int, str]:
        """Candidate with the smallest score (:meth:`score_s`); ties to the less loaded, then lower index.

        Where the KV wait makes the scores uncertain, the best-scored candidate's near ties
        (:func:`kv_wait_near_ties`) that hold the most reusable tokens among them are ranked instead by Dynamo's
        block cost (:meth:`~kvcost.routing.policies.dynamo.DynamoKvPolicy.costs`: the prefill blocks queued and its
        own uncached ones, plus the KV blocks the worker's requests hold) in each worker's prefill seconds
        (:meth:`block_cost_s`), and the lowest is chosen. Why: the lowest of several noisy estimates is biased low
        (the optimizer's curse), so ranking by the estimate alone sends every request to the worker whose wait it
        under-predicts most, until the gap closes; where the estimates cannot tell the candidates apart, the blocks
        each one's memory and queue hold are the measured load that its memory will take to free. Restricting to the
        most reuse keeps a prefix holder ahead of a worker that would recompute the prefix: the prefill a reuse
        saves is known, not estimated. Why it should hold on other workloads: nothing is fitted; the band is one
        standard deviation of the model's own spread, zero wherever no candidate's memory is short (then nothing
        changes), and Dynamo's cost is its published rule at its defaults, in seconds only where the workers differ.
        Measured: ``docs/routing-sensitivity.md``, "Near ties under the KV wait's spread" and "Near ties in each
        worker's seconds".
        """
        score_s = self.score_s(ctx)
        masked = np.where(ctx.allowed, score_s, np.inf)
        best = masked.min()
        ties = np.flatnonzero(masked == best)
        index = int(ties[np.argmin(ctx.load_tokens[ties])])
        near = kv_wait_near_ties(ctx, score_s, index)
        if len(near) > 1:
            most = near[ctx.reusable_tokens[near] == ctx.reusable_tokens[near].max()]
            index = int(most[np.argmin(self.block_cost_s(ctx)[most])])
        ttft_s = ctx.predictions.ttft_s
        price_ms = (score_s[index] - ttft_s[index]) * 1e3
        reason = f"min predicted TTFT {ttft_s[index] * 1e3:.1f} ms"
        if price_ms > 0:
            reason = f"min predicted TTFT + price {ttft_s[index] * 1e3:.1f} + {price_ms:.1f} ms"
        reason += f", reuse {ctx.reusable_tokens[index]} tokens"
        if len(near) > 1:
            reason += f"; {len(near)} within the KV wait's spread, most reuse then least Dynamo block cost in seconds"
        most_reuse = int(np.argmax(ctx.reusable_tokens))
        if most_reuse != index and ctx.reusable_tokens[most_reuse] > ctx.reusable_tokens[index]:
            why = "skew limit" if not ctx.allowed[most_reuse] else f"{ttft_s[most_reuse] * 1e3:.1f} ms"
            reason += f"; best-hit worker {ctx.snapshots[most_reuse].worker_id} not chosen ({why})"
        return index, reason


@ROUTER_POLICIES.register("learned_cost_aware")
class LearnedCostAwarePolicy(CostAwarePolicy):
    """``cost_aware`` on the learned models: the router predicts the terms with the learned
    :class:`~kvcost.models.term_set.TermModelSet` and this policy ranks by their composed TTFT.

    It ranks by the composed terms, not by the calibrated P50: the isotonic recalibration is
    monotone, so it cannot improve the order, and its steps map different TTFTs to one value;
    the ties then fell to the load tie-break and lost cache affinity (kvcost issue 13:
    ``gen:agent`` on 4 workers at 80 %, P99 18.1 s ranked by the calibrated P50, 0.56 s by the
    composed terms, 0.60 s for ``cost_aware``). The calibrated P50 / P90 are what it reports.
    Without a learned model (no champion, or it could not be loaded) the router has fallen
    back to the analytic model and this policy routes like ``cost_aware``.

    It ranks the near ties (:func:`kv_wait_near_ties`) as ``cost_aware`` does, with the analytic
    estimate's spread as their band: the spread is what no model that cannot see output lengths can
    know (which of the requests holding the memory finish first), so it bounds the learned queue term's
    power to tell workers apart as well as the analytic one's. Measured:
    ``docs/routing-sensitivity.md``, "Near ties in each worker's seconds".
    """

    name = "learned_cost_aware"
    learned = True
