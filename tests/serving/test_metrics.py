"""Tests for kvcost.serving.metrics's event-loop lag watch (the metric families are read through the API: test_api)."""

import asyncio
import logging
import time

import pytest
from prometheus_client import CollectorRegistry, Histogram

from kvcost.serving.metrics import stall_cause, watch_loop_lag


def _bucket(registry: CollectorRegistry, le: str) -> float:
    return registry.get_sample_value("lag_seconds_bucket", {"le": le})


def test_a_loop_blocked_for_a_third_of_a_second_is_observed_late_once_and_warned_of(caplog):
    registry = CollectorRegistry()
    lag = Histogram("lag_seconds", "lag", buckets=(0.25, 1.0), registry=registry)

    async def run() -> None:
        watching = asyncio.create_task(watch_loop_lag(lag, interval_s=0.1, warn_s=0.2))
        await asyncio.sleep(0)  # the watch starts its first sleep
        time.sleep(0.35)  # the loop is blocked past the sleep's end by at least 0.25 s
        await asyncio.sleep(0.01)  # the watch wakes (overdue), observes and sleeps again; this wakes first
        watching.cancel()

    with caplog.at_level(logging.WARNING, logger="kvcost.serving.metrics"):
        asyncio.run(run())
    assert registry.get_sample_value("lag_seconds_count") == 1
    assert _bucket(registry, "0.25") == 0  # the one observation is over 0.25 s
    [warning] = [r.getMessage() for r in caplog.records]
    assert warning.startswith("event loop stalled ") and warning.endswith(": blocked or starved of CPU")  # a sleep


@pytest.mark.parametrize(
    ("thread_s", "process_s", "cause"),
    [
        (1.0, 1.0, "a callback computing on the loop"),
        (0.99, 2.0, "other threads of the process"),  # the thread under half the wall time, the others over
        (0.2, 1.25, "other threads of the process"),
        (0.2, 1.1, "blocked or starved of CPU"),
    ],
)
def test_stall_cause_at_its_half_of_the_wall_time_bounds(thread_s, process_s, cause):
    assert stall_cause(2.0, thread_s, process_s) == cause
