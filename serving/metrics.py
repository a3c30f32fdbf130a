"""Prometheus metrics of the scoring service, one registry per service instance (no global default registry).

Exposed at ``GET /metrics`` (names as scraped; counters gain ``_total``):

===============================================  =======================================================
``kvcost_decisions_total``                       routing decisions by ``policy`` and ``reason_kind``
``kvcost_route_latency_seconds``                 service time of ``/v1/score`` and ``/v1/route``
``kvcost_profile_fallbacks_total``               per ``endpoint`` (score, route): answers for a model other
                                                 than the one the fleet serves, priced with ``--model``'s profile
``kvcost_namespace_unverified_total``            per ``endpoint`` (score, route): answers for which no scored
                                                 candidate's snapshot declared a namespace (the request's
                                                 model was checked against none)
                                                 (``endpoint``), from parsed body to response object
``kvcost_prediction_abs_error_seconds``          \\|actual − predicted\\| per ``term`` (five terms and
                                                 ``ttft``), from ``/v1/observe``
``kvcost_observations_total``                    observations by ``result`` (recorded, duplicate,
                                                 unknown, failed)
``kvcost_log_write_errors_total``                failed DuckDB batches
``kvcost_model_fallbacks_total``                 champion loads that fell back to the analytic model
``kvcost_model_degraded``                        1 while scoring on the fallback model
``kvcost_model_learned``                         1 while scoring with a learned model
``kvcost_kv_event_messages_total``               per ``worker``: ZMQ messages received
``kvcost_kv_event_batches_total``                per ``worker`` and ``source`` (live, replay): batches applied
``kvcost_kv_events_ingested_total``              per ``worker``: KV events applied to the directory
``kvcost_kv_blocks_total``                       per ``worker`` and ``op`` (stored, removed): blocks in them
``kvcost_kv_events_rejected_total``              per ``worker`` and ``scope``: malformed ``message`` (dropped
                                                 whole) or ``event`` (dropped inside a batch)
``kvcost_kv_events_skipped_total``               per ``worker`` and ``reason`` (unknown_type, other_group)
``kvcost_kv_event_gaps_total``                   per ``worker``: sequence gaps
``kvcost_kv_event_replays_requested_total``      per ``worker``: replays asked of the engine
``kvcost_kv_engine_restarts_total``              per ``worker``: sequences that went backwards
``kvcost_kv_event_unknown_topic_total``          messages on the bound socket from an unknown topic
``kvcost_directory_blocks``                      distinct block hashes indexed (all namespaces)
``kvcost_directory_staleness_seconds``           per ``worker``: time since its last KV event (+Inf: never)
``kvcost_directory_stale``                       per ``worker``: 1 while its entries may be wrong (lost events,
                                                 or its engine does not answer)
``kvcost_directory_mode``                        per ``worker`` and ``mode`` (exact: KV events; approximate:
                                                 routed prefixes with a TTL): 1 for the worker's mode
``kvcost_directory_capped_blocks_total``         per ``worker``: blocks dropped because it passed the cap
                                                 (``max_directory_blocks_per_worker``), oldest stored first
``kvcost_directory_blocks_held``                 per ``worker``: blocks it holds in the directory (any tier)
``kvcost_in_flight_capped_entries_total``        in-flight prefixes dropped at the same cap
``kvcost_snapshot_age_seconds``                  per ``worker``: age of its last snapshot (pushed or scraped)
``kvcost_decisions_in_memory``                   decisions held for /v1/observe
``kvcost_engine_scrapes_total``                  per ``worker`` and ``result`` (ok, timeout, unreachable,
                                                 http_error, parse_error, rejected): ``/metrics`` scrapes
``kvcost_engine_scrape_consecutive_failures``    per ``worker``: failed scrapes since the last good one
``kvcost_engine_prefix_cache_hit_ratio``         per ``worker``: the engine's prefix-cache token hit ratio
``kvcost_gateway_requests_total``                gateway: requests per ``worker`` and ``outcome`` (ok,
                                                 client_error, engine_error, failed_before_first_byte,
                                                 failed_mid_stream, cancelled)
``kvcost_gateway_ttft_seconds``                  gateway: TTFT at the first streamed token, arrival at the
                                                 gateway to first chunk forwarded
``kvcost_gateway_tokenize_seconds``              gateway: tokenization time per request by ``source``
                                                 (local, engine)
``kvcost_event_loop_lag_seconds``                how late the service's event loop woke from a
                                                 :data:`LOOP_LAG_INTERVAL_S` sleep (:func:`watch_loop_lag`):
                                                 the delay every request it serves shares then
``kvcost_gateway_connection_retries_total``      gateway: per ``worker``, requests sent again on a new
                                                 connection because the engine closed a pooled one under them
===============================================  =======================================================

The ``kvcost_kv_*`` counters and the ``kvcost_directory_*``,
``kvcost_snapshot_age_seconds`` and ``kvcost_decisions_in_memory`` gauges are
read from the service's state at scrape time (:meth:`ServiceMetrics.watch_state`;
the KV-event counters are the ingestor's per-worker
:class:`~kvcost.serving.engines.kv_events.IngestStats`); the scraper of
:mod:`kvcost.serving.engines.engine_metrics` counts into the ``kvcost_engine_*`` metrics.

Thread safety: prometheus-client metrics are thread-safe; the state callback
runs in the scraping thread (the event loop).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from kvcost.data.store import TERMS_AND_TTFT
from kvcost.serving.engines.kv_events import IngestStats

logger = logging.getLogger(__name__)
#: ``reason_kind`` label values kept; any further kind is counted as ``other`` (bounded cardinality).
MAX_REASON_KINDS = 64
#: Words of a reason kept in its kind.
REASON_KIND_WORDS = 6

LATENCY_BUCKETS_S = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)
ERROR_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: :func:`watch_loop_lag`'s sleep: short enough to see a stall of 0.1 s, rare enough to cost nothing (10 wake-ups/s).
LOOP_LAG_INTERVAL_S = 0.1
#: A wake-up this late (seconds) is logged as a warning (:func:`watch_loop_lag`).
LOOP_STALL_WARNING_S = 1.0


def reason_kind(reason: str) -> str:
    """Low-cardinality kind of a router reason string: its leading words before the first number.

    Only the first clause (before ``;``) counts, plus a ``(skew limit)`` marker
    when the hot-spot limit excluded the best-hit worker.

    Example:
        >>> reason_kind("min predicted TTFT 210.0 ms, reuse 0 tokens; best-hit worker 0 not chosen (skew limit)")
        'min predicted ttft (skew limit)'
        >>> reason_kind("round robin")
        'round robin'
    """
    words: list[str] = []
    for word in reason.split(";")[0].split():
        if any(ch.isdigit() for ch in word) or len(words) == REASON_KIND_WORDS:
            break
        words.append(word.strip(",:()").lower())
    kind = " ".join(w for w in words if w) or "other"
    return kind + " (skew limit)" if "skew limit" in reason else kind


#: ``reason`` labels of ``kvcost_model_fallbacks_total``: the champion's load timed out, or failed.
FALLBACK_REASONS: tuple[str, ...] = ("timeout", "load_failed")


@dataclass(frozen=True, slots=True)
class StateSample:
    """What the service reports at scrape time.

    Attributes:
        directory_blocks: distinct block hashes in the directory.
        directory_staleness_s: worker id → seconds since its last KV event (``inf`` if never).
        directory_stale: worker id → its entries may be wrong (events were lost, or its engine does not answer).
        directory_mode: worker id → ``exact`` (KV events) or ``approximate`` (routed prefixes with a TTL).
        directory_blocks_held: worker id → blocks it holds in the directory, any tier and namespace.
        directory_capped_blocks: worker id → blocks dropped because it passed the directory's cap.
        in_flight_capped_entries: in-flight prefixes dropped at the cap.
        snapshot_age_s: worker id → seconds since its last snapshot.
        decisions_in_memory: decisions held for ``/v1/observe``.
        kv_event_stats: worker id → the KV-event ingestor's counters (copies).
        kv_event_unknown_topic_messages: messages from an unknown topic (no worker).
    """

    directory_blocks: int = 0
    directory_staleness_s: dict[int, float] = field(default_factory=dict)
    directory_stale: dict[int, bool] = field(default_factory=dict)
    directory_mode: dict[int, str] = field(default_factory=dict)
    directory_blocks_held: dict[int, int] = field(default_factory=dict)
    directory_capped_blocks: dict[int, int] = field(default_factory=dict)
    in_flight_capped_entries: int = 0
    snapshot_age_s: dict[int, float] = field(default_factory=dict)
    decisions_in_memory: int = 0
    kv_event_stats: dict[int, IngestStats] = field(default_factory=dict)
    kv_event_unknown_topic_messages: int = 0


class _StateCollector:
    def __init__(self, sample: Callable[[], StateSample]) -> None:
        self._sample = sample

    def describe(self) -> Iterator[Metric]:
        return self._families(StateSample())

    def collect(self) -> Iterator[Metric]:
        return self._families(self._sample())

    @staticmethod
    def _families(s: StateSample) -> Iterator[Metric]:
        yield GaugeMetricFamily("kvcost_directory_blocks", "Distinct block hashes indexed", value=s.directory_blocks)
        yield _per_worker(
            GaugeMetricFamily,
            "kvcost_directory_staleness_seconds",
            "Seconds since the worker's last KV event",
            s.directory_staleness_s,
        )
        yield _per_worker(
            GaugeMetricFamily,
            "kvcost_directory_stale",
            "1 while the worker's entries may be wrong (lost KV events)",
            {w: 1.0 if stale else 0.0 for w, stale in s.directory_stale.items()},
        )
        mode = GaugeMetricFamily(
            "kvcost_directory_mode", "1 for the worker's directory mode (exact, approximate)", labels=["worker", "mode"]
        )
        for worker, name in sorted(s.directory_mode.items()):
            mode.add_metric([str(worker), name], 1.0)
        yield mode
        yield from _directory_cap_families(s)
        yield _per_worker(
            GaugeMetricFamily, "kvcost_snapshot_age_seconds", "Age of the worker's last snapshot", s.snapshot_age_s
        )
        yield GaugeMetricFamily(
            "kvcost_decisions_in_memory", "Decisions held for /v1/observe", value=s.decisions_in_memory
        )
        yield from _kv_event_families(s)
        yield CounterMetricFamily(
            "kvcost_kv_event_unknown_topic",
            "KV event messages from an unknown topic",
            value=s.kv_event_unknown_topic_messages,
        )


#: (name, help, extra label, {label value: IngestStats field or callable}) of the per-worker KV-event counters.
_KV_COUNTERS: tuple[tuple[str, str, str | None, dict], ...] = (
    ("kvcost_kv_event_messages", "KV event messages received", None, {"": "messages"}),
    (
        "kvcost_kv_event_batches",
        "KV event batches applied, by source",
        "source",
        {"live": lambda st: st.batches - st.replayed_batches, "replay": "replayed_batches"},
    ),
    ("kvcost_kv_events_ingested", "KV events applied to the directory", None, {"": "events"}),
    (
        "kvcost_kv_blocks",
        "Blocks in applied KV events, by op",
        "op",
        {"stored": "blocks_stored", "removed": "blocks_removed"},
    ),
    (
        "kvcost_kv_events_rejected",
        "Malformed KV event messages (dropped whole) and events (dropped inside a batch)",
        "scope",
        {"message": "rejected_messages", "event": "rejected_events"},
    ),
    (
        "kvcost_kv_events_skipped",
        "Well-formed KV events not applied, by reason",
        "reason",
        {"unknown_type": "unknown_events", "other_group": "skipped_events"},
    ),
    ("kvcost_kv_event_gaps", "KV event sequence gaps", None, {"": "gaps"}),
    ("kvcost_kv_event_replays_requested", "Replays asked of the engine after a gap", None, {"": "replay_requests"}),
    ("kvcost_kv_engine_restarts", "Engine restarts seen (sequence went backwards)", None, {"": "restarts"}),
)


def _per_worker(family: type, name: str, documentation: str, values: Mapping[int, float]) -> Metric:
    """A gauge or counter family with one sample per ``worker`` label, workers in order."""
    metric = family(name, documentation, labels=["worker"])
    for worker, value in sorted(values.items()):
        metric.add_metric([str(worker)], value)
    return metric


def _directory_cap_families(s: StateSample) -> Iterator[Metric]:
    yield _per_worker(
        GaugeMetricFamily,
        "kvcost_directory_blocks_held",
        "Blocks the worker holds in the directory, any tier",
        s.directory_blocks_held,
    )
    yield _per_worker(
        CounterMetricFamily,
        "kvcost_directory_capped_blocks",
        "Blocks dropped because the worker passed max_directory_blocks_per_worker (oldest stored first)",
        s.directory_capped_blocks,
    )
    yield CounterMetricFamily(
        "kvcost_in_flight_capped_entries",
        "In-flight prefixes dropped because their worker passed max_directory_blocks_per_worker",
        value=s.in_flight_capped_entries,
    )


def _kv_event_families(s: StateSample) -> Iterator[Metric]:
    for name, doc, label, values in _KV_COUNTERS:
        family = CounterMetricFamily(name, doc, labels=["worker"] if label is None else ["worker", label])
        for worker, stats in sorted(s.kv_event_stats.items()):
            for value, source in values.items():
                count = source(stats) if callable(source) else getattr(stats, source)
                family.add_metric([str(worker)] if label is None else [str(worker), value], count)
        yield family


class ServiceMetrics:
    """Every metric of one service instance, in its own :class:`CollectorRegistry`."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.decisions = Counter("kvcost_decisions", "Routing decisions", ["policy", "reason_kind"], registry=r)
        self.route_latency = Histogram(
            "kvcost_route_latency_seconds",
            "Service time of score and route requests",
            ["endpoint"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.prediction_abs_error = Histogram(
            "kvcost_prediction_abs_error_seconds",
            "Absolute error of the predicted term of the chosen worker",
            ["term"],
            buckets=ERROR_BUCKETS_S,
            registry=r,
        )
        self.observations = Counter("kvcost_observations", "Observations by result", ["result"], registry=r)
        self.log_write_errors = Counter("kvcost_log_write_errors", "Failed DuckDB write batches", registry=r)
        self.profile_fallbacks = Counter(
            "kvcost_profile_fallbacks",
            "Score and route answers for a model the service has no profile of (priced with --model's)",
            ["endpoint"],
            registry=r,
        )
        self.namespace_unverified = Counter(
            "kvcost_namespace_unverified",
            "Score and route answers for which no scored candidate declared the namespace it serves",
            ["endpoint"],
            registry=r,
        )
        self.model_fallbacks = Counter(
            "kvcost_model_fallbacks", "Champion loads that fell back to the analytic model", ["reason"], registry=r
        )
        for reason in FALLBACK_REASONS:  # exported at 0 from the start: an alert on it sees data, not absence
            self.model_fallbacks.labels(reason)
        self.model_degraded = Gauge("kvcost_model_degraded", "1 while scoring on the fallback model", registry=r)
        self.model_learned = Gauge("kvcost_model_learned", "1 while scoring with a learned model", registry=r)
        self.engine_scrapes = Counter(
            "kvcost_engine_scrapes", "Scrapes of the engines' /metrics, by result", ["worker", "result"], registry=r
        )
        self.engine_scrape_failures_in_row = Gauge(
            "kvcost_engine_scrape_consecutive_failures",
            "Failed scrapes of the worker since its last good one",
            ["worker"],
            registry=r,
        )
        self.engine_prefix_cache_hit_ratio = Gauge(
            "kvcost_engine_prefix_cache_hit_ratio",
            "The engine's prefix-cache token hit ratio (over the last scrape interval when counters allow)",
            ["worker"],
            registry=r,
        )
        self.gateway_requests = Counter(
            "kvcost_gateway_requests", "Gateway requests by worker and outcome", ["worker", "outcome"], registry=r
        )
        self.gateway_ttft = Histogram(
            "kvcost_gateway_ttft_seconds",
            "TTFT at the gateway: arrival to the first streamed chunk forwarded",
            buckets=ERROR_BUCKETS_S,
            registry=r,
        )
        self.gateway_connection_retries = Counter(
            "kvcost_gateway_connection_retries",
            "Gateway requests sent again on a new connection: the engine closed a pooled one under them",
            ["worker"],
            registry=r,
        )
        self.event_loop_lag = Histogram(
            "kvcost_event_loop_lag_seconds",
            "How late the event loop woke from a short sleep: a delay every request shares",
            buckets=ERROR_BUCKETS_S,
            registry=r,
        )
        self.gateway_tokenize = Histogram(
            "kvcost_gateway_tokenize_seconds",
            "Tokenization time per gateway request, by source (local, engine)",
            ["source"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        for term in TERMS_AND_TTFT:  # every term series exists from the start
            self.prediction_abs_error.labels(term)
        for endpoint in ("score", "route"):
            self.route_latency.labels(endpoint)
            self.namespace_unverified.labels(endpoint)
            self.profile_fallbacks.labels(endpoint)
        self._reason_kinds: set[str] = set()

    def count_decision(self, policy: str, reason: str) -> None:
        """Count one decision under its policy and :func:`reason_kind` (``other`` past :data:`MAX_REASON_KINDS`)."""
        kind = reason_kind(reason)
        if kind not in self._reason_kinds:
            if len(self._reason_kinds) >= MAX_REASON_KINDS:
                kind = "other"
            else:
                self._reason_kinds.add(kind)
        self.decisions.labels(policy, kind).inc()

    def watch_state(self, sample: Callable[[], StateSample]) -> None:
        """Report the gauges of :class:`StateSample` from ``sample()`` at every scrape (call once)."""
        self.registry.register(_StateCollector(sample))

    def render(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)


async def watch_loop_lag(
    lag: Histogram, interval_s: float = LOOP_LAG_INTERVAL_S, warn_s: float = LOOP_STALL_WARNING_S
) -> None:
    """Observe, into ``lag``, how late the running loop wakes from each ``interval_s`` sleep; runs until cancelled.

    A late wake-up is time in which the loop ran nothing else: a blocking call, a long callback, or the
    process starved of CPU. Every request the loop serves then waits as long (its TTFT grows, and a
    connection kept alive can outlive the engine's keep-alive timeout: ``gateway.engine_http.post``).
    Node.js's ``perf_hooks.monitorEventLoopDelay`` measures the same way, from a timer's late firing.

    A wake-up ``warn_s`` or more late is logged as a warning with the CPU seconds used meanwhile by the
    loop's thread and by the whole process (:func:`stall_cause` reads them).
    """
    loop = asyncio.get_running_loop()
    while True:
        before, thread_before, process_before = loop.time(), time.thread_time(), time.process_time()
        await asyncio.sleep(interval_s)
        late_s = max(0.0, loop.time() - before - interval_s)
        lag.observe(late_s)
        if late_s >= warn_s:
            thread_s, process_s = time.thread_time() - thread_before, time.process_time() - process_before
            logger.warning(
                "event loop stalled %.2f s: its thread used %.2f CPU s, the process %.2f: %s",
                late_s, thread_s, process_s, stall_cause(late_s + interval_s, thread_s, process_s),
            )  # fmt: skip


def stall_cause(wall_s: float, thread_s: float, process_s: float) -> str:
    """What a stall of ``wall_s`` seconds was, from the CPU seconds the loop's thread and the process used in it.

    The loop's thread busy most of it (≥ half): a callback that computes. The process busy but not
    the thread: likely other threads holding the GIL (a thread in C code that releases it runs beside
    the loop instead). Neither: the thread waited (a blocking call) or the operating system ran other
    processes (a loaded machine); these two are not told apart here.

    Example:
        >>> stall_cause(2.0, 1.9, 1.95), stall_cause(2.0, 0.1, 1.8), stall_cause(2.0, 0.05, 0.1)
        ('a callback computing on the loop', 'other threads of the process', 'blocked or starved of CPU')
    """
    if thread_s >= 0.5 * wall_s:
        return "a callback computing on the loop"
    if process_s - thread_s >= 0.5 * wall_s:
        return "other threads of the process"
    return "blocked or starved of CPU"
