"""Prometheus metrics of the scoring service, one registry per service instance (no global default registry).

Exposed at ``GET /metrics`` (names as scraped; counters gain ``_total``):

=========================================  =======================================================
``kvcost_decisions_total``                 routing decisions by ``policy`` and ``reason_kind``
``kvcost_route_latency_seconds``           service time of ``/v1/score`` and ``/v1/route``
                                           (``endpoint``), from parsed body to response object
``kvcost_prediction_abs_error_seconds``    \\|actual − predicted\\| per ``term`` (five terms and
                                           ``ttft``), from ``/v1/observe``
``kvcost_observations_total``              observations by ``result`` (recorded, duplicate,
                                           unknown, failed)
``kvcost_log_write_errors_total``          failed DuckDB batches
``kvcost_model_fallbacks_total``           champion loads that fell back to the analytic model
``kvcost_model_degraded``                  1 while scoring on the fallback model
``kvcost_model_learned``                   1 while scoring with a learned model
``kvcost_kv_events_ingested_total``        KV events applied to the directory, by ``kind``
``kvcost_kv_events_rejected_total``        KV events / messages refused, by ``reason``
``kvcost_directory_blocks``                distinct block hashes indexed (all namespaces)
``kvcost_directory_staleness_seconds``     per ``worker``: time since its last KV event (+Inf: never)
``kvcost_snapshot_age_seconds``            per ``worker``: age of its last pushed snapshot
``kvcost_decisions_in_memory``             decisions held for /v1/observe
=========================================  =======================================================

The KV-event ingestor counts into :attr:`ServiceMetrics.kv_events_ingested` and
:attr:`ServiceMetrics.kv_events_rejected`; the last four are read from the
service's state at scrape time (:meth:`ServiceMetrics.watch_state`).

Thread safety: prometheus-client metrics are thread-safe; the state callback
runs in the scraping thread (the event loop).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from kvcost.models.composition import TERMS

#: ``reason_kind`` label values kept; any further kind is counted as ``other`` (bounded cardinality).
MAX_REASON_KINDS = 64
#: Words of a reason kept in its kind.
REASON_KIND_WORDS = 6

LATENCY_BUCKETS_S = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)
ERROR_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


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


@dataclass(frozen=True, slots=True)
class StateSample:
    """What the service reports at scrape time.

    Attributes:
        directory_blocks: distinct block hashes in the directory.
        directory_staleness_s: worker id → seconds since its last KV event (``inf`` if never).
        snapshot_age_s: worker id → seconds since its last pushed snapshot.
        decisions_in_memory: decisions held for ``/v1/observe``.
    """

    directory_blocks: int = 0
    directory_staleness_s: dict[int, float] = field(default_factory=dict)
    snapshot_age_s: dict[int, float] = field(default_factory=dict)
    decisions_in_memory: int = 0


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
        stale = GaugeMetricFamily(
            "kvcost_directory_staleness_seconds", "Seconds since the worker's last KV event", labels=["worker"]
        )
        for worker, age_s in sorted(s.directory_staleness_s.items()):
            stale.add_metric([str(worker)], age_s)
        yield stale
        snap = GaugeMetricFamily("kvcost_snapshot_age_seconds", "Age of the worker's last snapshot", labels=["worker"])
        for worker, age_s in sorted(s.snapshot_age_s.items()):
            snap.add_metric([str(worker)], age_s)
        yield snap
        yield GaugeMetricFamily(
            "kvcost_decisions_in_memory", "Decisions held for /v1/observe", value=s.decisions_in_memory
        )


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
        self.model_fallbacks = Counter(
            "kvcost_model_fallbacks", "Champion loads that fell back to the analytic model", ["reason"], registry=r
        )
        self.model_degraded = Gauge("kvcost_model_degraded", "1 while scoring on the fallback model", registry=r)
        self.model_learned = Gauge("kvcost_model_learned", "1 while scoring with a learned model", registry=r)
        self.kv_events_ingested = Counter(
            "kvcost_kv_events_ingested", "KV events applied to the directory", ["kind"], registry=r
        )
        self.kv_events_rejected = Counter(
            "kvcost_kv_events_rejected", "KV events or messages refused", ["reason"], registry=r
        )
        for term in (*TERMS, "ttft"):  # every term series exists from the start
            self.prediction_abs_error.labels(term)
        for endpoint in ("score", "route"):
            self.route_latency.labels(endpoint)
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
