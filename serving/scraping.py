"""The engine-metrics scraper of ``kvcost serve``: every ``--scrape`` target and gateway engine, into the
service's worker snapshots, the engines' liveness and the gateway's own load accounting."""

from __future__ import annotations

from kvcost.serving.engines.engine_metrics import EngineMetricsScraper, ScrapeTarget, parse_scrape_target
from kvcost.serving.engines.liveness import EngineLiveness
from kvcost.serving.gateway.load import SentLoad
from kvcost.serving.schemas import SnapshotAck, SnapshotIn
from kvcost.serving.service import ScoringService
from kvcost.serving.settings import ServiceSettings, parse_engine


def engine_scraper(
    settings: ServiceSettings, service: ScoringService, liveness: EngineLiveness, load: SentLoad | None = None
) -> EngineMetricsScraper | None:
    """A scraper turning the engines' ``/metrics`` into the service's worker snapshots, or None.

    Scraped: every ``settings.scrape`` target, and each gateway engine (``settings.engines``) that
    no ``scrape`` entry names, at ``URL/metrics``. Each scrape's outcome reaches ``liveness``; each
    stored snapshot reaches the gateway's ``load`` (:meth:`SentLoad.scraped`), when there is a gateway.
    """
    targets = [parse_scrape_target(spec) for spec in settings.scrape]
    named = {t.worker_id for t in targets}
    for spec in settings.engines:
        worker_id, url = parse_engine(spec)
        if worker_id not in named:
            targets.append(ScrapeTarget(worker_id, f"{url}/metrics"))
    if not targets:
        return None

    def push(worker_id: int, body: SnapshotIn) -> SnapshotAck:
        ack = service.push_snapshot(worker_id, body)
        if load is not None:
            load.scraped(worker_id, ack.received_at_s)
        return ack

    return EngineMetricsScraper(
        targets,
        push,
        service.metrics,
        settings.scrape_interval_s,
        settings.scrape_timeout_s,
        on_scrape=liveness.on_scrape,
    )
