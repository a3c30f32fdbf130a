"""Trace-replay cluster simulator: a deterministic discrete-event loop over simulated workers.

The loop embeds the production :class:`~kvcost.routing.router.Router` and
:class:`~kvcost.routing.directory.CacheDirectory` (docs/architecture.md §3: no second
copy of routing logic). Time is the simulation clock, advanced only by
events: trace arrivals, worker step ends and periodic load samples. Same
trace, configuration and seed → identical results.

KV events from the workers reach the directory ``directory_lag_s`` late; the
router therefore sees a possibly stale directory, and a promised reuse that is
gone at admission is recorded as ``directory_mismatch_tokens``.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from kvcost.core.types import REMOTE_STORE_ID, Namespace, ReusePlan, RouteDecision, RouteRequest, reusable_tokens_for
from kvcost.data.log_rows import CandidateLog, RequestRow, requests_frame
from kvcost.data.traces import Trace
from kvcost.eviction import EvictionContext, block_cost_table
from kvcost.eviction.index import make_eviction_index, needs_index
from kvcost.models.term_set import TermModelSet
from kvcost.replay.config import ClusterConfig
from kvcost.replay.kv_cache import BLOCK_EVENT_COLUMNS, BlockPool
from kvcost.replay.online import NO_UNCHOSEN, CompletedRequest, OnlineLearner, OnlineSettings, route_figures
from kvcost.replay.reuse_refit import ReuseRefit
from kvcost.replay.sim_request import SimRequest
from kvcost.replay.tiers import TierCache, WorkerTiers
from kvcost.replay.worker import SimWorker, WorkerTruth
from kvcost.routing.directory import CacheDirectory
from kvcost.routing.policies import PolicyContext
from kvcost.routing.router import Router


@dataclass(frozen=True)
class ReplayResult:
    """Everything one replay produced.

    Attributes:
        requests: one row per measured request (warm-up excluded), columns of the
            DuckDB ``requests`` table minus ``run_id``.
        candidates: one row per measured request × candidate worker (features and
            predicted terms), columns of ``candidates`` minus ``run_id``.
        worker_samples: worker load every ``sample_interval_s``.
        utilisation: per worker, fraction of the measured span (first measured
            arrival → last completion) during which a request waited for its first
            token, shape ``(n_workers,)``, in [0, 1].
        makespan_s: first measured arrival → last completion.
        rejected_requests: requests whose whole sequence needs more KV blocks than
            the chosen worker has at all (they could never be admitted); not served.
        preemptions: recompute preemptions (a decoder found no free KV block, vLLM's rule,
            :mod:`kvcost.replay.worker`) from the first measured arrival on, all workers.
        evicted_blocks: cached GPU blocks evicted (by ``config.eviction_policy``) from the first
            measured arrival on, all workers: 0 where everything fit, so the eviction order decided nothing.
        eviction_policy: the policy the workers' caches evicted by; None with the cache off.
        retrains: online learning only: each retraining (``t_s``, ``rows``, ``trigger``).
        drift_alerts: online learning only: each drift alert (``t_s``, worker, term, message).
        served_coverage_90: ``{"coverage", "requests"}``: the share of measured requests whose TTFT
            was at most the P90 bound served for them when they were routed (by a model trained
            only on earlier data, with the router's adaptive conformal factor), and how many had
            one; None when no bound was served (analytic routing).
        block_events: with ``record_block_events`` only: every worker's KV block access history,
            ``worker_id`` plus :data:`~kvcost.replay.kv_cache.BLOCK_EVENT_COLUMNS`, in time order per worker.
    """

    requests: pd.DataFrame
    candidates: pd.DataFrame
    worker_samples: pd.DataFrame
    utilisation: np.ndarray
    makespan_s: float
    rejected_requests: int = 0
    preemptions: int = 0
    evicted_blocks: int = 0
    eviction_policy: str | None = None
    retrains: tuple[dict, ...] = ()
    drift_alerts: tuple[dict, ...] = ()
    served_coverage_90: dict | None = None
    block_events: pd.DataFrame | None = None


class ClusterSimulator:
    """Replays a trace through ``config.workers`` simulated workers and the embedded router.

    Construction builds the (empty) cluster; :meth:`run` replays. One
    simulator instance runs one replay.

    Args:
        config: the cluster.
        block_size_tokens: KV block size (the trace's).
        cost_model: the router's cost model (None = analytic), e.g. a registered champion.
        online: retrain the router's models on the replay's own log as it goes.
        eviction: settings of ``config.eviction_policy`` (horizon, re-rank interval, reuse model);
            None = defaults. Block costs come from the router's cost model at construction.
        record_block_events: keep every pool's block access history (``ReplayResult.block_events``).
        reuse_refit: refit ``cost_aware`` eviction's P(reuse) on that history on a schedule
            (:class:`~kvcost.replay.reuse_refit.ReuseRefit`; the pools then keep their history).
    """

    def __init__(
        self,
        config: ClusterConfig,
        block_size_tokens: int,
        cost_model: TermModelSet | None = None,
        online: OnlineSettings | None = None,
        eviction: EvictionContext | None = None,
        record_block_events: bool = False,
        reuse_refit: ReuseRefit | None = None,
    ) -> None:
        self.config = config
        self.eviction = eviction
        self.record_block_events = record_block_events
        self.reuse_refit = reuse_refit
        self.block_size_tokens = block_size_tokens
        self.namespace = Namespace(config.model, block_size_tokens=block_size_tokens)
        self.step_models = {gpu: config.step_model(gpu) for gpu in sorted(set(config.fleet))}
        self.directory = CacheDirectory()
        if online is not None and cost_model is None:
            cost_model = TermModelSet.analytic()  # online learning starts analytic by design: no fallback warning
        # with the cache off nothing routed is ever reusable: no in-flight prefixes either
        router_settings = config.router if config.cache_enabled else replace(config.router, count_in_flight=False)
        self.router = Router(self.directory, self.step_models, router_settings, cost_model)
        self._arriving: tuple = ()  # (trace request, its full block hashes) while it is being routed
        self.router.policy.attach_truth(self._true_ttfts_s)
        self.online = OnlineLearner(online, window_replay=self.replay_window) if online is not None else None
        self._trace: Trace | None = None  # the trace being replayed (the replay gate's windows come from it)
        self._completed_ids: set[int] = set()  # requests completed so far (with the replay gate on)
        self.workers = [self._make_worker(i, gpu) for i, gpu in enumerate(config.fleet)]
        self.remote: TierCache | None = None
        if config.tiers is not None and config.cache_enabled and config.tiers.remote_bytes:
            block_bytes = self.workers[0].tiers.block_bytes
            self.remote = TierCache("remote", config.tiers.capacity_blocks("remote", block_bytes))
        self._pending_events: deque[tuple[float, int, str, list[int], int | None, str]] = deque()

    def _make_worker(self, worker_id: int, gpu: str) -> SimWorker:
        step_model = self.step_models[gpu]
        slow = [s for s in self.config.slowdowns if s.worker_id == worker_id]
        truth = WorkerTruth(
            jitter_sigma=self.config.jitter_sigma,
            speed_fraction=slow[-1].speed_fraction if slow else 1.0,
            slowdown_from_s=slow[-1].from_s if slow else math.inf,
        )
        capacity_blocks = self.config.kv_capacity_blocks or step_model.kv_capacity_blocks(
            self.block_size_tokens, self.config.gpu_memory_utilization
        )
        index = None
        if self.config.cache_enabled and needs_index(self.config.eviction_policy):  # no cache: nothing to evict
            costs = block_cost_table(self.router.cost_model, step_model, self.block_size_tokens)
            index = make_eviction_index(self.config.eviction_policy, self.eviction, costs, capacity_blocks)
        history = self.record_block_events or self.reuse_refit is not None
        pool = BlockPool(capacity_blocks, self.config.cache_enabled, index, history)
        tiers = None
        if self.config.tiers is not None and self.config.cache_enabled:
            tiers = WorkerTiers(self.config.tiers, step_model.model.kv_bytes_per_token * self.block_size_tokens)
        return SimWorker(worker_id, gpu, step_model, pool, self.block_size_tokens, truth, self.config.seed, tiers)

    # -- the event loop ------------------------------------------------------------
    def run(self, trace: Trace, progress: Callable[[int], None] | None = None) -> ReplayResult:
        """Replay ``trace``; ``progress(n)`` is called with the number of newly completed (or rejected) requests."""
        if trace.block_size_tokens != self.block_size_tokens:
            raise ValueError(f"trace block_size_tokens = {trace.block_size_tokens}, expected {self.block_size_tokens}")
        log = _Log(self.config, len(self.workers), keep_unchosen=self.online is not None)
        block_events = _GrowingBlockEvents(self.workers) if self.reuse_refit is not None else None
        self._trace = trace
        measured = [r.arrival_s for r in trace.requests if r.arrival_s >= self.config.warmup_s]
        for worker in self.workers:
            worker.measure_from_s = measured[0] if measured else math.inf
        steps: list[tuple[float, int, int]] = []
        requests = trace.requests
        next_arrival, next_sample = 0, 0.0
        while next_arrival < len(requests) or steps:
            t_arrival = requests[next_arrival].arrival_s if next_arrival < len(requests) else math.inf
            t_step = steps[0][0] if steps else math.inf
            if next_sample <= t_arrival and next_sample <= t_step:
                log.sample(next_sample, self.workers)
                next_sample += self.config.sample_interval_s
            elif t_step <= t_arrival:
                now, worker_id, token = heapq.heappop(steps)
                worker = self.workers[worker_id]
                if token != worker.step_token:
                    continue  # an empty wait cut short by an arrival
                done = worker.finish_step(now)
                log.complete(done)
                for r in done:
                    self.router.on_finished(r.output_tokens)
                for r in worker.first_tokens:
                    self.router.on_outcome(r.request_id, r.first_token_s - r.arrival_s, now)
                worker.first_tokens.clear()
                if self.online is not None and done:
                    if self.online.settings.gate_on_replay:  # only the replay gate's windows need them
                        self._completed_ids.update(r.request_id for r in done)
                    self.online.observe(log.observed, now)
                if progress is not None and done:
                    progress(len(done))
                self._start(worker, now, steps)
            else:
                if self.reuse_refit is not None and t_arrival >= self.reuse_refit.next_s:
                    policies = [w.pool.ranking_policy for w in self.workers if w.pool.ranking_policy is not None]
                    self.reuse_refit.maybe_refit(t_arrival, block_events, policies)
                if self.online is not None:
                    model_set = self.online.maybe_retrain(log.observed, t_arrival, self.router.policy)
                    if model_set is not None:
                        self.router.set_cost_model(model_set)
                served = self._arrive(requests[next_arrival], t_arrival, steps, log)
                next_arrival += 1
                if progress is not None and not served:
                    progress(1)
        result = log.result(self.workers)
        if self.record_block_events:
            result = replace(result, block_events=_block_events(self.workers))
        if self.online is not None:
            result = replace(result, retrains=tuple(self.online.retrains), drift_alerts=tuple(self.online.alerts))
        return result

    def replay_window(self, model_set: TermModelSet, now_s: float) -> dict[str, float]:
        """The online learner's replay gate: the latest window routed by ``model_set``, after a warm-up.

        The window is the requests of the trace being replayed that arrived in the latest
        ``online.replay_window_s`` before ``now_s`` (replay seconds) and have completed by then,
        what a live fleet's log holds at that moment: no arrival after ``now_s`` and no output
        length not yet known is used. They are replayed at their own arrival times on a fresh
        cluster of this configuration (same fleet, slowdowns, seed; no online learning), with this
        replay's router policy ranking by ``model_set``, after the completed requests of the
        ``online.replay_warmup_s`` before the window, routed by the same set and not measured.

        Why the warm-up: a window replayed from an empty cluster lacks the queues and cache the
        run carries into it, and did not predict the run it was cut from (stop 35, at 4 workers
        and 95 % load, where the queues run to a minute); with the state that the set itself
        would have built, the window measures its routing under that load. It only matters where
        the run is longer than the window.

        Returns:
            :func:`~kvcost.replay.online.route_figures` of the window's TTFTs (NaN when it is empty).

        Raises:
            RuntimeError: called outside :meth:`run` of an online replay.
        """
        if self._trace is None or self.online is None:
            raise RuntimeError("replay_window needs an online replay in progress (ClusterSimulator.run with online)")
        settings = self.online.settings
        span_s = settings.replay_window_s + settings.replay_warmup_s
        window = latest_window(self._trace, now_s, span_s, self._completed_ids)
        config = replace(self.config, warmup_s=max(0.0, now_s - settings.replay_window_s))
        result = ClusterSimulator(config, self.block_size_tokens, model_set, eviction=self.eviction).run(window)
        return route_figures(result.requests["actual_ttft_s"].to_numpy())

    def _arrive(self, trace_request, now: float, steps: list, log: _Log) -> bool:
        """Route and enqueue one arrival; False if it is rejected as larger than the worker's KV."""
        n_full = trace_request.input_tokens // self.block_size_tokens
        full_hashes = trace_request.block_hashes[:n_full]
        self._deliver_events(now)
        request = RouteRequest(trace_request.request_id, now, trace_request.input_tokens, full_hashes, self.namespace)
        snapshots = [w.snapshot(now) for w in self.workers]
        self._arriving = (trace_request, full_hashes)
        decision = self.router.route(request, snapshots, now)
        predicted_reuse, stored_reuse = _promise_tokens(decision, trace_request.input_tokens, self.block_size_tokens)
        if not self.config.cache_enabled:
            predicted_reuse = stored_reuse = 0
        sim_request = SimRequest(
            trace_request.request_id,
            now,
            trace_request.input_tokens,
            trace_request.output_tokens,
            full_hashes,
            predicted_reuse,
            stored_reuse,
            decision.queued_reuse_tokens() if self.config.cache_enabled else 0,
        )
        worker = self.workers[decision.worker_id]
        total_tokens = trace_request.input_tokens + trace_request.output_tokens
        if -(-total_tokens // self.block_size_tokens) > worker.pool.capacity_blocks:
            log.rejected += 1
            return False
        log.route(sim_request, decision)
        plan = decision.plans[decision.chosen_index] if decision.plans else None
        if plan is not None and plan.option == "fetch" and self._fetch(worker, sim_request, plan, now):
            worker.enqueue_fetched(sim_request)
        else:
            worker.enqueue(sim_request)
        if worker.step_end_s is None or worker.idle_wait:
            self._start(worker, now, steps)
        return True

    def _fetch(self, worker: SimWorker, request: SimRequest, plan: ReusePlan, now: float) -> bool:
        """Start moving the planned prefix blocks to ``worker`` over its network link; False if none are there.

        The router planned from the (possibly stale) directory; what moves is what the
        source really holds now, from the end of the worker's own prefix. Layout
        conversion occupies the link ``conversion_factor`` times longer. Only the
        target's inbound link is charged: reading the blocks out of the source's
        GPU, CPU or disk is assumed to be pipelined under the network transfer (an
        assumption that flatters disk-resident sources, whose NVMe at 5 GB/s is
        slower than a 12 GiB/s network).
        """
        start = plan.gpu_blocks + plan.cpu_blocks + plan.disk_blocks
        held = self._held_prefix_blocks(plan.source_id, request.full_block_hashes)
        end = min(start + plan.fetch_blocks, held)
        if end <= start:
            return False
        request.fetch_hashes = request.full_block_hashes[start:end]
        n_bytes = len(request.fetch_hashes) * worker.tiers.block_bytes * (1.0 + plan.conversion_factor)
        _, request.ready_s = worker.tiers.network.reserve(now, n_bytes)
        request.transfer_s = request.ready_s - now
        return True

    def _held_prefix_blocks(self, source_id: int, chain: tuple[int, ...]) -> int:
        """Leading blocks of ``chain`` that ``source_id`` (a worker or the remote store) really holds, any tier."""
        if source_id == REMOTE_STORE_ID:
            return self.remote.match_from(chain, 0)
        source = self.workers[source_id]
        gpu_blocks = source.pool.match_blocks(chain)
        return gpu_blocks + sum(source.tiers.match_below(chain, gpu_blocks))

    def _true_ttfts_s(self, ctx: PolicyContext) -> np.ndarray:
        """The replay's truth for the request being routed (:data:`~kvcost.routing.policies.TruthFn`):
        its true TTFT on each candidate of ``ctx`` at ``ctx.now_s``, seconds ``(n,)``."""
        trace_request, full_hashes = self._arriving
        workers = [self.workers[s.worker_id] for s in ctx.snapshots]
        return np.array([self._true_ttft_s(w, trace_request, full_hashes, ctx.now_s) for w in workers])

    def _true_ttft_s(self, worker: SimWorker, trace_request, full_hashes: tuple[int, ...], now: float) -> float:
        """The TTFT this request would really get on ``worker`` if no other request arrived (the oracle's view)."""
        total_tokens = trace_request.input_tokens + trace_request.output_tokens
        if -(-total_tokens // self.block_size_tokens) > worker.pool.capacity_blocks:
            return math.inf
        probe = SimRequest(
            trace_request.request_id, now, trace_request.input_tokens, trace_request.output_tokens, full_hashes, 0
        )
        return worker.fork().run_until_first_token(probe, now) - now

    def _start(self, worker: SimWorker, now: float, steps: list) -> None:
        end = worker.start_step(now)
        if end is not None:
            heapq.heappush(steps, (end, worker.worker_id, worker.step_token))
        if worker.events:
            lag = self.config.directory_lag_s
            for t, kind, hashes, parent, tier in worker.events:
                self._pending_events.append((t + lag, worker.worker_id, kind, hashes, parent, tier))
                if self.remote is not None and kind == "stored" and tier == "gpu":
                    self._write_through(t + lag, hashes)
            worker.events.clear()

    def _write_through(self, t: float, hashes: list[int]) -> None:
        """Every block a worker computes is also put in the shared remote store (its LRU overflow is dropped)."""
        dropped = self.remote.put(hashes)
        self._pending_events.append((t, REMOTE_STORE_ID, "stored", hashes, None, "remote"))
        if dropped:
            self._pending_events.append((t, REMOTE_STORE_ID, "removed", dropped, None, "remote"))

    def _deliver_events(self, now: float) -> None:
        pending = self._pending_events
        while pending and pending[0][0] <= now:
            t, worker_id, kind, hashes, parent, tier = pending.popleft()
            if kind == "stored":
                self.directory.apply_stored(self.namespace, worker_id, hashes, parent, tier, t)
            else:
                self.directory.apply_removed(self.namespace, worker_id, hashes, t, tier)


def _promise_tokens(decision: RouteDecision, input_tokens: int, block_size_tokens: int) -> tuple[int, int]:
    """``(promised, stored)`` tokens on the chosen worker: the reuse the router counted at the decision
    (``predicted_reuse_tokens``), and the part of it the directory reported stored, in any tier
    (``directory_reuse_tokens``, ≤ promised; the rest is in flight). A fetched prefix is stored at
    its source, so a fetch plan's promise is all stored."""
    index = decision.chosen_index
    promised = int(decision.reusable_tokens[index])
    if decision.plans and decision.plans[index].option == "fetch":
        return promised, promised
    stored = reusable_tokens_for(decision.directory_blocks[index], block_size_tokens, input_tokens)
    return promised, min(promised, stored)


def latest_window(trace: Trace, now_s: float, window_s: float, completed_ids: set[int]) -> Trace:
    """``trace`` cut to the requests that arrived in ``[now_s − window_s, now_s)`` and are in ``completed_ids``.

    Arrival times stay as they are (seconds of replay time). Used by
    :meth:`ClusterSimulator.replay_window`.
    """
    start_s = now_s - window_s
    kept = tuple(r for r in trace.requests if start_s <= r.arrival_s < now_s and r.request_id in completed_ids)
    return replace(trace, requests=kept)


def _block_events(workers: list[SimWorker]) -> pd.DataFrame:
    """Every pool's access history as one frame: ``worker_id`` + ``BLOCK_EVENT_COLUMNS``."""
    return pd.concat([_worker_events(w, w.pool.block_events) for w in workers], ignore_index=True)


def _worker_events(worker: SimWorker, rows: list[tuple]) -> pd.DataFrame:
    """One pool's access ``rows`` as a frame: ``worker_id`` + ``BLOCK_EVENT_COLUMNS``."""
    frame = pd.DataFrame(rows or [], columns=list(BLOCK_EVENT_COLUMNS))
    frame.insert(0, "worker_id", worker.worker_id)
    return frame


class _GrowingBlockEvents:
    """:func:`_block_events` for a replay that asks again and again as the history grows (``cost_aware``'s
    refits): each pool's rows are converted once, the new ones appended (a pool's history is append-only).

    The frame equals :func:`_block_events`' value by value and dtype by dtype: a worker whose new rows
    convert to other dtypes than its earlier ones (a block hash past 2⁶³ − 1) is converted whole again.
    Converting every row at every refit took 12 % of a refitting replay of the bundled trace.
    """

    def __init__(self, workers: list[SimWorker]) -> None:
        self.workers = workers
        self.frames = [_worker_events(w, []) for w in workers]

    def __call__(self) -> pd.DataFrame:
        for i, w in enumerate(self.workers):
            done, rows = len(self.frames[i]), w.pool.block_events
            if len(rows) > done:
                new = _worker_events(w, rows[done:])
                if done and not new.dtypes.equals(self.frames[i].dtypes):
                    self.frames[i] = _worker_events(w, rows)
                else:
                    self.frames[i] = pd.concat([self.frames[i], new], ignore_index=True) if done else new
        return pd.concat(self.frames, ignore_index=True)


class _Log:
    """The replay's log as it happens, in typed rows (:mod:`kvcost.data.log_rows`); one DataFrame a table at the end."""

    def __init__(self, config: ClusterConfig, n_workers: int, keep_unchosen: bool = False) -> None:
        self.warmup_s = config.warmup_s
        self.keep_unchosen = keep_unchosen  # the online learner's importance weights need the rejected rows
        self.cache_enabled = config.cache_enabled
        self.eviction_policy = config.eviction_policy if config.cache_enabled else None
        self.n_workers = n_workers
        self.decisions: dict[int, tuple[int, np.ndarray, np.ndarray, float, np.ndarray]] = {}
        #: every measured request completed so far, in completion order (the online learner reads it)
        self.observed: list[CompletedRequest] = []
        self.candidates = CandidateLog()
        self.samples: list[tuple] = []
        self.rejected = 0
        self.first_arrival_s = math.inf
        self.last_finish_s = 0.0

    def route(self, request: SimRequest, decision: RouteDecision) -> None:
        if request.arrival_s < self.warmup_s:
            return
        self.first_arrival_s = min(self.first_arrival_s, request.arrival_s)
        preds = decision.predictions.as_matrix()
        index = decision.chosen_index
        p90_s = float(decision.calibrated.p90_s[index]) if decision.calibrated is not None else math.nan
        unchosen = np.delete(decision.features, index, axis=0) if self.keep_unchosen else NO_UNCHOSEN
        chosen = decision.features[index]
        self.decisions[request.request_id] = (decision.worker_id, preds[index], chosen, p90_s, unchosen)
        self.candidates.add(decision, preds)

    def complete(self, done: list[SimRequest]) -> None:
        for r in done:
            if r.request_id not in self.decisions:
                continue
            worker_id, pred, features, p90_s, unchosen = self.decisions.pop(r.request_id)
            self.last_finish_s = max(self.last_finish_s, r.finish_s)
            queue_s = r.queued_until_s - r.arrival_s
            prefill_s = r.prefill_end_s - (r.queued_until_s + r.lookup_s)
            ttft_s = r.first_token_s - r.arrival_s
            tpot_s = (r.finish_s - r.prefill_end_s) / (r.output_tokens - 1) if r.output_tokens > 1 else math.nan
            e2e_s = r.finish_s + r.first_token_overhead_s - r.arrival_s
            mismatch = max(0, r.predicted_reuse_tokens - r.reused_tokens)
            actual = (queue_s, r.lookup_s, r.transfer_s, prefill_s, r.first_token_overhead_s, ttft_s)
            row = RequestRow(
                request_id=r.request_id,
                arrival_s=r.arrival_s,
                worker_id=worker_id,
                input_tokens=r.input_tokens,
                output_tokens=r.output_tokens,
                predicted_reuse_tokens=r.predicted_reuse_tokens,
                directory_reuse_tokens=r.directory_reuse_tokens,
                actual_reuse_tokens=r.reused_tokens,
                predicted_s=tuple(pred.tolist()),
                actual_s=actual,
                tpot_s=tpot_s,
                e2e_s=e2e_s,
                directory_mismatch_tokens=mismatch,
                mismatch_lost_s=r.mismatch_lost_s,
                served_by=r.served_by,
                kv_wait_s=r.kv_wait_s,
                preemptions=r.preemptions,
            )
            self.observed.append(CompletedRequest(row, features, p90_s, r.finish_s, unchosen))

    def sample(self, now: float, workers: list[SimWorker]) -> None:
        for w in workers:
            self.samples.append(
                (
                    now,
                    w.worker_id,
                    len(w.waiting) + len(w.prefilling),
                    w.running_requests,
                    w.queued_prefill_tokens,
                    w.pool.usage(),
                    w.pool.idle_blocks,
                )
            )

    def result(self, workers: list[SimWorker]) -> ReplayResult:
        rows = [o.row for o in self.observed]
        requests = requests_frame(rows).sort_values("request_id", ignore_index=True)
        makespan_s = max(0.0, self.last_finish_s - self.first_arrival_s) if rows else 0.0
        busy = np.array([w.prefill_busy_s for w in workers])
        return ReplayResult(
            requests=requests,
            candidates=self.candidates.batch().frame(),
            worker_samples=pd.DataFrame(
                self.samples,
                columns=[
                    "t_s",
                    "worker_id",
                    "waiting_requests",
                    "running_requests",
                    "queued_prefill_tokens",
                    "kv_usage",
                    "idle_cached_blocks",
                ],
            ),
            utilisation=np.minimum(busy / makespan_s, 1.0) if makespan_s > 0 else np.zeros(len(workers)),
            makespan_s=makespan_s,
            rejected_requests=self.rejected,
            preemptions=sum(w.preemptions for w in workers),
            evicted_blocks=sum(w.evicted_blocks for w in workers),
            eviction_policy=self.eviction_policy,
            served_coverage_90=self._served_coverage(),
        )

    def _served_coverage(self) -> dict | None:
        served = [(o.row.actual_s[-1], o.p90_s) for o in self.observed if not math.isnan(o.p90_s)]
        if not served:
            return None
        covered = sum(ttft_s <= bound_s for ttft_s, bound_s in served)
        return {"coverage": covered / len(served), "requests": len(served)}
