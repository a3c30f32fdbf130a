"""A simulated GPU worker: continuous batching with chunked prefill over a prefix-cached block pool.

Ground truth of the replay. Each step has a token budget shared by one decode
token per running request and FCFS prefill chunks of waiting requests (vLLM
v1 scheduler). Step time = the GPU type's nominal step time (measured Vidur
operator profile + attention FLOPs + overhead, :class:`StepTimeModel`) ×
seeded log-normal jitter × the worker's straggler slowdown, + the lookup time
of the requests admitted in that step. The router knows none of the jitter,
the slowdown, or KV-admission waits.

Per-request actual terms (seconds), exact by construction:

* Q = ``queued_until_s`` − arrival at the worker: the wait for admission (the
  first prefill chunk's step start); a request whose prefix is loaded from a
  lower tier also waits from the end of the load to its first chunk, so for it
  ``queued_until_s`` = that chunk's step start − L;
* L = the request's prefix lookup / preparation (tier loads included);
* X = its KV transfer over the network (inside Q on the critical path);
* P = end of the step holding its last prefill chunk − (``queued_until_s`` + L);
* F = first-token work after that step (sampling, detokenise, network);

so TTFT = first token − arrival = Q + L + X + P + F.

KV memory is allocated as vLLM v1 allocates it (``vllm/v1/core/sched/scheduler.py``,
``kv_cache_manager.allocate_slots``): a request's prompt blocks at admission,
then a block whenever a decoding sequence fills its last one; no output is
reserved. When a decoder finds no block, the most recently admitted running
request is preempted (its blocks freed, its prefix left cached), put back at
the head of the waiting queue, and later recomputes its prompt and the output
it had produced (vLLM's recompute preemption). A request preempted before its
first token counts the lost time in Q (its last admission starts P); one
preempted after it keeps its TTFT terms, and its recompute is load on the
worker. ``preemptions`` counts them.
"""

from __future__ import annotations

import copy
import heapq
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from kvcost.core.hardware import StepTimeModel
from kvcost.core.types import WorkerSnapshot, blocks_to_allocate, reusable_tokens_for
from kvcost.features.nominal import NominalCosts
from kvcost.replay.kv_cache import BlockPool
from kvcost.replay.sim_request import SimRequest
from kvcost.replay.tiers import WorkerTiers

_JITTER_BATCH = 4096


@dataclass(frozen=True, slots=True)
class WorkerTruth:
    """Ground-truth effects of one worker that the router does not model.

    Attributes:
        jitter_sigma: σ of the log-normal multiplicative per-step jitter (default 0.05,
            an assumption of ~5 % step-to-step variation), ≥ 0.
        speed_fraction: the worker's speed relative to its GPU type once straggling
            (0.6: step times ÷ 0.6), > 0.
        slowdown_from_s: simulated time from which the slowdown applies.
        costs: actual lookup and first-token costs (default equal to the nominal ones).
    """

    jitter_sigma: float = 0.05
    speed_fraction: float = 1.0
    slowdown_from_s: float = math.inf
    costs: NominalCosts = field(default_factory=NominalCosts)


class SimWorker:
    """One simulated worker.

    Args:
        worker_id: index in the cluster.
        gpu: GPU type name (the router sees this and its nominal profile).
        step_model: the nominal step-time model of that GPU type and model.
        pool: the worker's KV block pool.
        block_size_tokens: tokens per KV block.
        truth: ground-truth effects (jitter, slowdown, actual fixed costs).
        seed: seed of this worker's jitter stream.
        tiers: CPU / disk tiers and links behind the GPU pool (None: GPU only).

    ``measure_from_s`` (default 0) is the time from which steps count toward
    ``prefill_busy_s``: the time of steps started while a request waited for its
    first token (queued or in prefill), i.e. the prefill server's busy time.

    ``start_step(now_s)`` begins a step and returns its end time (or None when
    idle); ``finish_step(now_s)`` applies it and returns the requests that
    finished. Requests whose first token came out in a step accumulate in
    ``first_tokens`` until the caller drains them (a live router learns a TTFT
    at the first streamed token, not when the request completes). Events for
    the directory accumulate in ``events`` as
    ``(time_s, "stored" | "removed", hashes, parent_hash, tier)`` until the caller
    drains them.
    """

    def __init__(
        self,
        worker_id: int,
        gpu: str,
        step_model: StepTimeModel,
        pool: BlockPool,
        block_size_tokens: int,
        truth: WorkerTruth,
        seed: int,
        tiers: WorkerTiers | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.tiers = tiers
        self.idle_wait = False  # the running "step" is an empty wait for a transfer or tier load
        self.step_token = 0  # identifies the running step; a step event with another token is void
        self.loading: list[SimRequest] = []  # admitted, prefix still being copied into GPU memory
        self.fetching: list[SimRequest] = []  # routed, KV still arriving over the network
        self.gpu = gpu
        self.step_model = step_model
        self.pool = pool
        self.block_size_tokens = block_size_tokens
        self.truth = truth
        self._rng = np.random.default_rng([seed, worker_id])
        self._jitter: list[float] = []
        self.waiting: deque[SimRequest] = deque()
        self.prefilling: list[SimRequest] = []
        self._decoding: list[tuple[int, int, SimRequest]] = []
        self._admitted: list[SimRequest] = []  # holding KV, in admission order (vLLM's ``running``)
        self._growth: list[tuple[int, int, SimRequest]] = []  # (decode step, id, request): next block needed
        self.preemptions = 0  # counted from ``measure_from_s``
        self.evicted_blocks = 0  # GPU blocks evicted, counted from ``measure_from_s``
        self.decode_steps = 0
        self.decode_context_tokens = 0
        self.queued_prefill_tokens = 0
        self._queue_new_blocks = 0  # Σ new blocks of the not-yet-admitted requests (_queue_changed)
        self._unadmitted_view: tuple[tuple[tuple[int, int], ...], float] | None = None  # snapshot's cache
        self.step_end_s: float | None = None
        self.last_step_s = 0.0  # last finished step, as the router sees it
        self.last_step_nominal_s = 0.0
        self._step_s = (0.0, 0.0)  # (actual, nominal) of the step now running
        self._step_start_s = 0.0
        self.prefill_busy_s = 0.0
        self.measure_from_s = 0.0
        self._chunks: list[tuple[SimRequest, int]] = []
        self.events: list[tuple[float, str, list[int], int | None]] = []
        self.first_tokens: list[SimRequest] = []

    # -- observation -----------------------------------------------------------
    @property
    def running_requests(self) -> int:
        """Requests in decode."""
        return len(self._decoding)

    def snapshot(self, now_s: float) -> WorkerSnapshot:
        """Load as the router sees it at ``now_s``.

        Prefill tokens of the step now running are left out of ``waiting_prefill``
        (their time is in ``step_remaining_s``, from the step's nominal time); requests not yet admitted count
        their remaining tokens and blocks net of the reuse the router expects them to find at admission
        (``SimRequest.router_reuse_tokens``), as a router's own accounting of what it sent would.
        """
        in_step = {id(r): n for r, n in self._chunks}  # being computed now: covered by step_remaining_s
        waiting = tuple(
            (r.queued_tokens - in_step.get(id(r), 0), r.computed_tokens + in_step.get(id(r), 0))
            for r in self.prefilling
            if r.queued_tokens > in_step.get(id(r), 0)
        )
        unadmitted, oldest_arrival_s = self._unadmitted()
        waiting += unadmitted
        waiting += tuple((r.queued_tokens, r.computed_tokens) for r in self.loading)
        return WorkerSnapshot(
            worker_id=self.worker_id,
            gpu=self.gpu,
            waiting_prefill=waiting,
            running_requests=len(self._decoding),
            decode_context_tokens=self.decode_context_tokens,
            kv_usage=self.pool.usage(),
            idle_cached_blocks=self.pool.idle_blocks,
            recent_step_s=self.last_step_s,
            step_remaining_s=self._step_remaining_s(now_s),
            kv_capacity_blocks=self.pool.capacity_blocks,
            waiting_prompt_blocks=self._queue_new_blocks + self.pool.watched_idle_blocks,
            oldest_waiting_s=now_s - oldest_arrival_s if unadmitted else 0.0,
            recent_step_nominal_s=self.last_step_nominal_s,
            load_backlog_s=self.tiers.pcie.backlog_s(now_s) if self.tiers else 0.0,
            transfer_backlog_s=self.tiers.network.backlog_s(now_s) if self.tiers else 0.0,
            running_output_tokens=tuple(
                r.emitted_tokens + 1 + self.decode_steps - r.decode_start_step for _, _, r in self._decoding
            ),
        )

    def _unadmitted(self) -> tuple[tuple[tuple[int, int], ...], float]:
        """The requests routed here and holding no KV yet (fetching, then waiting), as the snapshot's
        ``(prefill tokens left, reuse expected)`` pairs, and the earliest arrival among them (inf if none).

        Cached until the queue changes (:meth:`_queue_changed`): while a request waits, neither its
        tokens nor its expected reuse change, and a router reads every worker at every arrival.
        """
        if self._unadmitted_view is None:
            unadmitted = (*self.fetching, *self.waiting)
            pairs = tuple((r.queued_tokens, r.router_reuse_tokens) for r in unadmitted)
            self._unadmitted_view = pairs, min((r.arrival_s for r in unadmitted), default=math.inf)
        return self._unadmitted_view

    def _queue_changed(self, request: SimRequest | None = None, joined: bool = True) -> None:
        """Keep the snapshot's view of the not-yet-admitted requests: ``request`` joined (or left) them,
        or, with no request, only their order changed.

        ``waiting_prompt_blocks`` is the blocks admitting them takes from the free and idle blocks:
        each request's new blocks (its prompt less the prefix the router expects it to reuse), plus
        the blocks of those prefixes that are cached and idle now, each counted once over the queue:
        admission pins an idle block as surely as it allocates a new one. The pool keeps the second
        part as blocks change state (:meth:`BlockPool.watch`), so a snapshot reads both in O(1). A
        router knows the same from its directory (the stored blocks) and the prompts of the requests
        it has running on the worker (the held ones); a prefix still being computed by an earlier
        request is that request's new blocks, and a prefix a running request holds takes nothing.

        Why it matters: counting only the new blocks takes the queue's reused prefixes for free memory. A
        conversation's turn reuses thousands of tokens of its own history and allocates a few hundred,
        so a queue of such turns needs about ten times the blocks counted. On an L40S serving
        Llama-2-7B (a few conversations fit in memory) the router then saw the same predicted queue on a
        worker whose queue held long conversations and on the others, and that worker's requests waited
        twice as long as predicted (kvcost issue 13; ``docs/routing-unseen-workloads.md``, "The blocks a
        queue's reused prefixes pin").
        """
        self._unadmitted_view = None
        if request is None:
            return
        sign = 1 if joined else -1
        size, reuse = self.block_size_tokens, request.router_reuse_tokens
        self._queue_new_blocks += sign * blocks_to_allocate(request.sequence_tokens, reuse, size)
        if reuse >= size:
            self.pool.watch(request.full_block_hashes[: reuse // size], sign)

    def _step_remaining_s(self, now_s: float) -> float:
        """Time left in the step now running as the router can know it: its start + its nominal
        time − now (not its true, jittered or slowed end), ≥ 0; 0 when idle (an arrival restarts
        an idle-waiting worker)."""
        if self.step_end_s is None or self.idle_wait:
            return 0.0
        return max(0.0, self._step_start_s + self._step_s[1] - now_s)

    def fork(self) -> SimWorker:
        """An independent copy of the worker's whole state, jitter stream included.

        Running the copy forward shows what *would* happen with no further
        arrivals (the oracle's true T_i); the original is untouched.
        """
        twin = copy.copy(self)
        everyone = (*self.waiting, *self.prefilling, *self.loading, *self.fetching, *(e[2] for e in self._decoding))
        twins = {id(r): r.fork() for r in everyone}
        twin.pool = self.pool.fork()
        twin.tiers = self.tiers.fork() if self.tiers is not None else None
        twin.loading = [twins[id(r)] for r in self.loading]
        twin.fetching = [twins[id(r)] for r in self.fetching]
        twin._rng = copy.deepcopy(self._rng)
        twin._jitter = list(self._jitter)
        twin.waiting = deque(twins[id(r)] for r in self.waiting)
        twin.prefilling = [twins[id(r)] for r in self.prefilling]
        twin._decoding = [(f, i, twins[id(r)]) for f, i, r in self._decoding]
        twin._admitted = [twins[id(r)] for r in self._admitted]
        twin._growth = [(k, i, twins[id(r)]) for k, i, r in self._growth if id(r) in twins]
        heapq.heapify(twin._growth)  # finished requests' stale entries are left out
        twin._chunks = [(twins[id(r)], n) for r, n in self._chunks]
        twin.events = []
        twin.first_tokens = []
        return twin

    def run_until_first_token(self, request: SimRequest, now_s: float) -> float:
        """Enqueue ``request`` at ``now_s`` and step until its first token; returns that time.

        Mutates this worker: call it on a :meth:`fork`. Returns ``inf`` when the
        request can never be admitted (the worker idles with it still waiting).
        """
        self.enqueue(request)
        if self.step_end_s is None or self.idle_wait:  # as the simulator does on an arrival
            self.start_step(now_s)
        while math.isnan(request.prefill_end_s):
            end_s = self.step_end_s
            if end_s is None:
                return math.inf
            self.finish_step(end_s)
            self.start_step(end_s)
        return request.first_token_s

    # -- requests --------------------------------------------------------------
    def enqueue(self, request: SimRequest) -> None:
        """Add a routed request to the FCFS waiting queue."""
        self.waiting.append(request)
        self.queued_prefill_tokens += request.queued_tokens
        self._queue_changed(request)

    def enqueue_fetched(self, request: SimRequest) -> None:
        """Add a routed request whose prefix is arriving over the network (``fetch_hashes``, by ``ready_s``).

        It joins the FCFS waiting queue when the transfer ends, the fetched blocks then
        sitting in this worker's CPU memory (vLLM's connector keeps such a request
        out of scheduling until its KV has arrived).
        """
        self.fetching.append(request)
        self.queued_prefill_tokens += request.queued_tokens
        self._queue_changed(request)

    # -- steps -----------------------------------------------------------------
    def _wake(self, now_s: float) -> None:
        """Requests whose transfer or tier load has finished by ``now_s`` move on."""
        if self.fetching:
            arrived = [r for r in self.fetching if r.ready_s <= now_s]
            for request in arrived:
                self.fetching.remove(request)
                self._tier_events(now_s, self.tiers.put_cpu(list(request.fetch_hashes)))
                self.waiting.append(request)
                self._queue_changed()
        if self.loading:
            loaded = [r for r in self.loading if r.ready_s <= now_s]
            for request in loaded:
                self.loading.remove(request)
                self.prefilling.append(request)

    def _next_wake_s(self) -> float | None:
        """Earliest end of a pending transfer or tier load (None when there is none)."""
        pending = [r.ready_s for r in (*self.fetching, *self.loading)]
        return min(pending) if pending else None

    def start_step(self, now_s: float) -> float | None:
        """Form a batch at ``now_s``; returns the step's end time, or None if there is no work.

        With nothing to compute but transfers or tier loads pending, the worker
        idles until the first of them ends (an empty step).
        """
        self._wake(now_s)
        self._grow_decoders(now_s)
        n_decode = len(self._decoding)
        budget = self.step_model.token_budget - n_decode
        chunks: list[tuple[SimRequest, int]] = []
        flops = 0.0
        for request in self.prefilling:
            if budget <= 0:
                break
            if math.isnan(request.queued_until_s):  # loaded from a lower tier: first chunk now
                request.queued_until_s = now_s - request.lookup_s
            n = min(request.sequence_tokens - request.computed_tokens, budget)
            flops += self.step_model.prefill_attention_flops(n, request.computed_tokens)
            chunks.append((request, n))
            self._register(request, request.computed_tokens + n, now_s)
            budget -= n
        lookup_s = 0.0
        while self.waiting and budget > 0 and self._admit_head(now_s):
            request = self.waiting.popleft()
            self._queue_changed(request, joined=False)
            if request.ready_s > now_s:
                self.loading.append(request)
                continue
            self.prefilling.append(request)
            lookup_s = max(lookup_s, request.admission_lookup_s)
            if not request.first_token_out:
                request.queued_until_s = now_s
            n = min(request.sequence_tokens - request.computed_tokens, budget)
            flops += self.step_model.prefill_attention_flops(n, request.computed_tokens)
            chunks.append((request, n))
            self._register(request, request.computed_tokens + n, now_s)
            budget -= n
        self.step_token += 1
        if not chunks and not n_decode:
            self._chunks = []
            self.idle_wait = True
            self.step_end_s = self._next_wake_s()
            return self.step_end_s
        self.idle_wait = False
        num_tokens = self.step_model.token_budget - budget
        nominal_s = self.step_model.step_s(num_tokens, flops, self.decode_context_tokens) + lookup_s
        step_s = (nominal_s - lookup_s) * self._next_jitter() * self._slowdown(now_s) + lookup_s
        self._step_s = (step_s, nominal_s)
        self._step_start_s = now_s
        waiting_first_token = chunks or self.waiting or self.loading or self.fetching
        if waiting_first_token and now_s >= self.measure_from_s:
            self.prefill_busy_s += step_s
        self._chunks = chunks
        self.step_end_s = now_s + step_s
        return self.step_end_s

    def finish_step(self, now_s: float) -> list[SimRequest]:
        """Apply the step that ends at ``now_s``; returns requests that completed (last token out)."""
        if not self.idle_wait:  # the router sees a step's time once it has finished
            self.last_step_s, self.last_step_nominal_s = self._step_s
        done = self._advance_decode(now_s)
        for request, n in self._chunks:
            request.computed_tokens += n
            self.queued_prefill_tokens -= n
            if request.computed_tokens == request.sequence_tokens:
                self._finish_prefill(request, now_s, done)
        self._chunks = []
        self.step_end_s = None
        return done

    # -- internals -------------------------------------------------------------
    def _admit_head(self, now_s: float) -> bool:
        """Admit the head of the waiting queue (:meth:`_admit`), timing how long KV memory kept it out.

        The head is blocked by memory, not by compute, when the step still has prefill budget for
        it: that time, up to its first token, is its ``kv_wait_s`` (the ground truth of the router's
        KV-wait estimate).
        """
        request = self.waiting[0]
        if not self._admit(request, now_s):
            if math.isnan(request.kv_blocked_since_s) and not request.first_token_out:
                request.kv_blocked_since_s = now_s
            return False
        if not math.isnan(request.kv_blocked_since_s):
            request.kv_wait_s += now_s - request.kv_blocked_since_s
            request.kv_blocked_since_s = math.nan
        return True

    def _admit(self, request: SimRequest, now_s: float) -> bool:
        """Allocate KV for ``request``'s sequence and find its prefix: GPU blocks are free, lower-tier ones are loaded.

        A request with blocks to load gets ``ready_s`` after ``now_s`` (the PCIe
        copy, queued behind earlier loads) and waits in ``loading``; its lookup
        time ``L`` includes that wait. A request readmitted after a preemption
        that came after its first token keeps its TTFT terms.
        """
        n_full = request.input_tokens // self.block_size_tokens
        chain = request.full_block_hashes[:n_full]
        total_blocks = -(-request.sequence_tokens // self.block_size_tokens)
        cpu_blocks = disk_blocks = gpu_blocks = 0
        if self.tiers is not None:  # found before the allocation's own evictions are demoted
            gpu_blocks = self.pool.match_blocks(chain)
            cpu_blocks, disk_blocks = self.tiers.match_below(chain, gpu_blocks)
        allocation, evicted = self.pool.try_allocate(chain, total_blocks, now_s)
        if allocation is None:
            return False
        if evicted:
            cpu_blocks, disk_blocks = self._evicted(now_s, evicted, chain, gpu_blocks, cpu_blocks + disk_blocks)
        before = request.queued_tokens
        request.allocation = allocation
        self._admitted.append(request)
        loaded_blocks = cpu_blocks + disk_blocks
        reused_blocks = allocation.reused_blocks + loaded_blocks
        reused_tokens = reusable_tokens_for(reused_blocks, self.block_size_tokens, request.input_tokens)
        request.computed_tokens = reused_tokens
        self.queued_prefill_tokens += request.queued_tokens - before
        lookup_s = self.truth.costs.lookup_s(n_full)
        if loaded_blocks:
            loaded = chain[gpu_blocks:reused_blocks]
            lookup_s += self.tiers.load(now_s, loaded, cpu_blocks, disk_blocks) - now_s
            request.ready_s = now_s + lookup_s
        request.admission_lookup_s = lookup_s
        if request.first_token_out:
            return True
        request.admitted_s = now_s
        request.loaded_blocks = loaded_blocks
        request.reused_tokens = reused_tokens
        request.lookup_s = lookup_s
        request.first_token_overhead_s = self.truth.costs.first_token_s
        mismatch_tokens = max(0, request.predicted_reuse_tokens - request.reused_tokens)
        if mismatch_tokens and not request.preemptions:  # promised at the decision, missing at first admission
            request.mismatch_lost_s = self.step_model.prefill_alone_s(mismatch_tokens, request.reused_tokens)
        return True

    def _evicted(self, now_s: float, evicted: list[int], chain=(), gpu_blocks: int = 0, below: int = 0):
        """Report GPU evictions and demote them to the CPU tier; returns the request's ``(cpu, disk)`` blocks.

        ``chain[gpu_blocks : gpu_blocks + below]`` is the prefix of the request being admitted found in
        the lower tiers: it is about to be loaded, the most recent there, so others are demoted first.
        """
        if now_s >= self.measure_from_s:
            self.evicted_blocks += len(evicted)
        self._tier_events(now_s, [("removed", "gpu", evicted)])
        if self.tiers is None:
            return 0, 0
        matched = chain[gpu_blocks : gpu_blocks + below]
        self.tiers.cpu.touch(matched)
        self.tiers.disk.touch(matched)
        self._tier_events(now_s, self.tiers.put_cpu(evicted))
        return self.tiers.match_below(chain, gpu_blocks)  # what is still there

    def _grow_decoders(self, now_s: float) -> None:
        """Give each decoder that fills its last block in the coming step one more, preempting when none is left.

        vLLM schedules its running requests in admission order and, when one finds no free
        block, preempts the most recently admitted (``self.running.pop()``) until it fits
        or is itself preempted.
        """
        upcoming = self.decode_steps + 1
        while self._growth and self._growth[0][0] <= upcoming:
            step, _, request = heapq.heappop(self._growth)
            if step != request.next_block_step or not math.isnan(request.finish_s):
                continue  # stale: preempted or finished since
            if self._grow(request, now_s):
                request.next_block_step = step + self.block_size_tokens
                heapq.heappush(self._growth, (request.next_block_step, request.request_id, request))

    def _grow(self, request: SimRequest, now_s: float) -> bool:
        """One more block for ``request``; False when it was preempted itself to make room."""
        while True:
            evicted = self.pool.grow(request.allocation, 1, now_s)
            if evicted is not None:
                if evicted:
                    self._evicted(now_s, evicted)
                return True
            victim = self._admitted[-1]
            self._preempt(victim, now_s)
            if victim is request:
                return False

    def _preempt(self, request: SimRequest, now_s: float) -> None:
        """Free ``request``'s KV (its cached prefix stays cached) and put it back at the head of the queue."""
        self._admitted.remove(request)
        if request.next_block_step >= 0:  # decoding: it leaves the batch with the tokens it produced
            self._decoding = [entry for entry in self._decoding if entry[2] is not request]
            heapq.heapify(self._decoding)
            self.decode_context_tokens -= request.decode_context_start + self.decode_steps - request.decode_start_step
            request.emitted_tokens += 1 + self.decode_steps - request.decode_start_step
            request.next_block_step = -1
        elif request in self.prefilling:
            self.prefilling.remove(request)
        else:
            self.loading.remove(request)
        before = request.queued_tokens
        self.pool.free(request.allocation, now_s)
        request.allocation = None
        request.computed_tokens = 0
        self.queued_prefill_tokens += request.queued_tokens - before
        if not request.first_token_out:
            request.queued_until_s = math.nan
        request.preemptions += 1
        if now_s >= self.measure_from_s:
            self.preemptions += 1
        self.waiting.appendleft(request)
        self._queue_changed(request)

    def _tier_events(self, now_s: float, events: list[tuple[str, str, list[int]]]) -> None:
        for kind, tier, hashes in events:
            self.events.append((now_s, kind, hashes, None, tier))

    def _finish_prefill(self, request: SimRequest, now_s: float, done: list[SimRequest]) -> None:
        self.prefilling.remove(request)
        if not request.first_token_out:
            request.prefill_end_s = now_s
            self.first_tokens.append(request)
        remaining_steps = request.output_tokens - request.emitted_tokens - 1  # the prefill step made one
        if remaining_steps <= 0:
            self._complete(request, now_s, done)
            return
        request.decode_start_step = self.decode_steps
        request.decode_context_start = request.sequence_tokens + 1
        self.decode_context_tokens += request.decode_context_start
        heapq.heappush(self._decoding, (self.decode_steps + remaining_steps, request.request_id, request))
        # decode step k writes the KV of token sequence + k - 1: a new block when that token opens one
        request.next_block_step = self.decode_steps + (-request.sequence_tokens) % self.block_size_tokens + 1
        heapq.heappush(self._growth, (request.next_block_step, request.request_id, request))

    def _register(self, request: SimRequest, computed_tokens: int, now_s: float) -> None:
        """Cache the request's full prompt blocks within its first ``computed_tokens`` tokens (those
        computed, or scheduled in the step starting at ``now_s``), and report the new ones stored."""
        n_full = request.input_tokens // self.block_size_tokens
        chain = request.full_block_hashes[: min(n_full, computed_tokens // self.block_size_tokens)]
        start = len(request.allocation.cached_hashes)
        stored = self.pool.register_prefill(request.allocation, chain, now_s, request_blocks=n_full)
        if stored:
            parent = chain[start - 1] if start else None
            self.events.append((now_s, "stored", stored, parent, "gpu"))

    def _advance_decode(self, now_s: float) -> list[SimRequest]:
        done: list[SimRequest] = []
        if not self._decoding:
            return done
        self.decode_steps += 1
        self.decode_context_tokens += len(self._decoding)
        while self._decoding and self._decoding[0][0] <= self.decode_steps:
            _, _, request = heapq.heappop(self._decoding)
            self.decode_context_tokens -= request.decode_context_start + self.decode_steps - request.decode_start_step
            self._complete(request, now_s, done)
        return done

    def _complete(self, request: SimRequest, now_s: float, done: list[SimRequest]) -> None:
        request.finish_s = now_s
        request.next_block_step = -1
        self._admitted.remove(request)
        self.pool.free(request.allocation, now_s)
        done.append(request)

    def _next_jitter(self) -> float:
        if not self._jitter:
            sigma = self.truth.jitter_sigma
            draws = self._rng.lognormal(-0.5 * sigma * sigma, sigma, _JITTER_BATCH) if sigma else np.ones(_JITTER_BATCH)
            self._jitter = draws.tolist()
        return self._jitter.pop()

    def _slowdown(self, now_s: float) -> float:
        return 1.0 / self.truth.speed_fraction if now_s >= self.truth.slowdown_from_s else 1.0
