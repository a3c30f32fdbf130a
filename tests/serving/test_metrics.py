"""Tests for kvcost.serving.metrics's event-loop lag watch (the metric families are read through the API: test_api)."""

import asyncio
import time

from prometheus_client import CollectorRegistry, Histogram

from kvcost.serving.metrics import watch_loop_lag


def _bucket(registry: CollectorRegistry, le: str) -> float:
    return registry.get_sample_value("lag_seconds_bucket", {"le": le})


def test_a_loop_blocked_for_a_third_of_a_second_is_observed_late_once():
    registry = CollectorRegistry()
    lag = Histogram("lag_seconds", "lag", buckets=(0.25, 1.0), registry=registry)

    async def run() -> None:
        watching = asyncio.create_task(watch_loop_lag(lag, interval_s=0.1))
        await asyncio.sleep(0)  # the watch starts its first sleep
        time.sleep(0.35)  # the loop is blocked past the sleep's end by at least 0.25 s
        await asyncio.sleep(0.01)  # the watch wakes (overdue), observes and sleeps again; this wakes first
        watching.cancel()

    asyncio.run(run())
    assert registry.get_sample_value("lag_seconds_count") == 1
    assert _bucket(registry, "0.25") == 0  # the one observation is over 0.25 s
