"""Tests for kvcost.serving.engines.liveness: no reuse promised on a dead engine, none kept from a restarted one."""

import threading

from kvcost.core.types import Namespace
from kvcost.routing.directory import CacheDirectory
from kvcost.serving.engines.engine_metrics import EngineMetrics
from kvcost.serving.engines.kv_events import KVEventIngestor
from kvcost.serving.engines.liveness import EngineLiveness

NS = Namespace("tiny", block_size_tokens=32)


def started_at(start_s):
    return EngineMetrics("vllm", process_start_time_s=start_s)


NEW_PROCESSES = []


def setup():
    directory = CacheDirectory()
    ingestor = KVEventIngestor(directory, lambda worker_id: NS)
    directory.apply_stored(NS, 0, [1, 2], None, "gpu", now_s=1.0)
    NEW_PROCESSES.clear()
    return directory, ingestor, EngineLiveness(directory, threading.Lock(), lambda: 5.0, ingestor, NEW_PROCESSES.append)


def blocks(directory):
    m = directory.match(NS, [1, 2], [0], now_s=6.0)[0]
    return m.reusable_blocks, m.stale


def test_a_failed_scrape_makes_the_worker_unknown_and_the_same_process_brings_its_entries_back():
    directory, _, liveness = setup()
    liveness.on_scrape(0, started_at(1000.0))
    assert blocks(directory) == (2, False)
    liveness.on_scrape(0, None)  # timeout, refused, HTTP error
    assert blocks(directory) == (0, True)
    liveness.on_scrape(0, started_at(1000.0))  # the same process answers again: its cache is intact
    assert blocks(directory) == (2, False) and liveness.restarts == {} and NEW_PROCESSES == []


def test_a_new_process_drops_the_entries_and_the_event_sequence_before_it_is_matched_again():
    directory, ingestor, liveness = setup()
    liveness.on_scrape(0, started_at(1000.0))
    ingestor._expected[0] = 57  # the old engine's next sequence number
    liveness.unreachable(0)  # the gateway could not connect
    assert blocks(directory) == (0, True)
    liveness.on_scrape(0, started_at(1090.5))  # back, as a new process that has served nothing yet
    assert blocks(directory) == (0, False) and directory.num_blocks(NS) == 0
    assert ingestor.expected_seq(0) is None and liveness.restarts == {0: 1} and NEW_PROCESSES == [0]


def test_an_engine_without_a_start_time_is_taken_as_the_same_process():
    directory, _, liveness = setup()
    liveness.on_scrape(0, None)
    liveness.on_scrape(0, EngineMetrics("vllm"))
    assert blocks(directory) == (2, False)
