"""Tests for kvcost.serving.gateway.load: what the gateway sent, corrected by scrapes."""

import pytest

from kvcost.core.types import WorkerSnapshot
from kvcost.serving.gateway.load import SentLoad


def scraped(waiting=(), running=0, context=0, kv_usage=0.5) -> WorkerSnapshot:
    return WorkerSnapshot(0, "a100", tuple(waiting), running, context, kv_usage, 0, 0.02, 0.0, 80, 3)


def test_a_request_queues_prefill_net_of_reuse_then_decodes_then_leaves():
    load = SentLoad()
    load.routed(1, worker_id=0, input_tokens=100, reusable_tokens=64)
    load.routed(2, worker_id=0, input_tokens=50, reusable_tokens=0)
    load.routed(3, worker_id=1, input_tokens=10, reusable_tokens=0)
    assert load.counts(0) == (2, 0, 36 + 50)
    snap = load.snapshot(0, "a100", None, block_size_tokens=32)
    # blocks to allocate: request 1's 4 less its 2 reused, request 2's 2
    assert (snap.waiting_prefill, snap.running_requests, snap.waiting_prompt_blocks) == (((36, 64), (50, 0)), 0, 4)
    load.first_token(1)
    load.generated(1, 5)
    assert load.counts(0) == (1, 1, 50)
    assert load.snapshot(0, "a100", None, 32).decode_context_tokens == 100 + 5
    assert load.snapshot(0, "a100", None, 32).running_output_tokens == (5,)  # the tokens streamed so far
    load.finished(1)
    load.finished(1)  # idempotent
    load.first_token(99)  # unknown ids are ignored
    assert load.counts(0) == (1, 0, 50) and len(load) == 2


def test_a_scrape_of_unknown_time_adds_what_the_gateway_did_not_send_and_keeps_the_larger_counts():
    load = SentLoad()
    load.routed(1, worker_id=0, input_tokens=100, reusable_tokens=64)
    # the engine also queues two requests sent by another path, and decodes more than the gateway knows
    snap = load.snapshot(0, "h100", scraped(waiting=[(80, 0)] * 3, running=5, context=900), 32)
    assert snap.waiting_prefill == ((36, 64), (80, 0), (80, 0))
    assert (snap.running_requests, snap.decode_context_tokens, snap.kv_usage, snap.kv_capacity_blocks) == (
        4, 900, 0.5, 80,
    )  # fmt: skip
    assert snap.gpu == "a100"  # the scrape's own GPU type is kept


def test_a_noted_scrape_adds_only_its_excess_over_the_gateways_own_requests_then():
    load = SentLoad()
    load.routed(1, worker_id=0, input_tokens=100, reusable_tokens=64)
    load.routed(2, worker_id=0, input_tokens=200, reusable_tokens=0)
    load.first_token(2)
    load.generated(2, 4)  # request 2 decodes with 204 tokens of KV
    load.scraped(0, received_at_s=10.0)
    # the engine, read then: request 1 and one other waiting; request 2 and two others decoding (900 tokens of KV)
    stored = scraped(waiting=[(80, 0)] * 2, running=3, context=900)
    snap = load.snapshot(0, "a100", stored, 32, scraped_at_s=10.0)
    assert snap.waiting_prefill == ((36, 64), (80, 0))
    assert (snap.running_requests, snap.decode_context_tokens, snap.waiting_prompt_blocks) == (3, 204 + 696, 2 + 1)
    # the burst ends before the next scrape: the scrape's copies of the gateway's requests go with it
    load.finished(1)
    load.finished(2)
    snap = load.snapshot(0, "a100", stored, 32, scraped_at_s=10.0)
    assert (snap.waiting_prefill, snap.running_requests, snap.decode_context_tokens) == (((80, 0),), 2, 696)
    assert snap.waiting_prompt_blocks == 1


def test_an_engine_running_what_the_gateway_counts_as_waiting_is_no_other_request():
    # request 1 is in its prefill step on the engine (running there) and has no first token at the gateway yet
    load = SentLoad()
    load.routed(1, worker_id=0, input_tokens=100, reusable_tokens=0)
    load.scraped(0, received_at_s=3.0)
    snap = load.snapshot(0, "a100", scraped(running=1, context=100), 32, scraped_at_s=3.0)
    assert (snap.waiting_prefill, snap.running_requests, snap.decode_context_tokens) == (((100, 0),), 0, 0)


def test_a_snapshot_the_gateway_did_not_note_keeps_the_larger_counts():
    load = SentLoad()
    load.routed(1, worker_id=0, input_tokens=100, reusable_tokens=64)
    load.scraped(0, received_at_s=3.0)
    # pushed over the API at 4.0: which of its requests are the gateway's is unknown
    snap = load.snapshot(0, "a100", scraped(waiting=[(80, 0)] * 3, running=5, context=900), 32, scraped_at_s=4.0)
    assert (snap.waiting_prefill, snap.running_requests) == (((36, 64), (80, 0), (80, 0)), 4)


def test_the_stored_prefixes_a_queue_will_pin_count_once_unless_a_decoder_holds_them():
    load = SentLoad()

    def blocks() -> int:
        return load.snapshot(0, "a100", None, block_size_tokens=32).waiting_prompt_blocks

    load.routed(1, 0, input_tokens=128, reusable_tokens=64, cached_prefix=(1, 2), prompt_blocks=(1, 2, 3, 4))
    load.routed(2, 0, input_tokens=96, reusable_tokens=64, cached_prefix=(1, 2), prompt_blocks=(1, 2, 5))
    # new blocks 2 + 1, and the idle prefix (1, 2) both will pin, once
    assert blocks() == 3 + 2
    load.routed(3, 0, input_tokens=96, reusable_tokens=64, cached_prefix=(1, 2), prompt_blocks=(1, 2, 9))
    assert blocks() == 3 + 1 + 2
    load.first_token(3)  # request 3 decodes and holds (1, 2): the queue pins nothing idle
    load.first_token(3)  # a repeated first token changes nothing
    assert blocks() == 3
    load.finished(3)
    assert blocks() == 3 + 2
    load.first_token(1)
    assert blocks() == 1  # request 2's new block; its prefix is held by request 1
    load.finished(1)
    assert blocks() == 1 + 2
    load.finished(2)
    assert blocks() == 0 and load.snapshot(1, "a100", None, 32).waiting_prompt_blocks == 0


def test_a_cached_prefix_that_does_not_begin_the_prompt_is_refused():
    with pytest.raises(ValueError, match=r"cached_prefix = \[2\]… \(1 blocks\), expected the first blocks"):
        SentLoad().routed(1, 0, input_tokens=64, reusable_tokens=32, cached_prefix=(2,), prompt_blocks=(1, 2))


def test_reuse_beyond_the_input_is_refused():
    with pytest.raises(ValueError, match="reusable_tokens = 11"):
        SentLoad().routed(1, 0, input_tokens=10, reusable_tokens=11)


def test_a_request_routed_again_leaves_its_first_worker():
    # a retry on the next-best candidate re-routes the same id
    load = SentLoad()
    load.routed(7, worker_id=0, input_tokens=100, reusable_tokens=0)
    load.routed(8, worker_id=1, input_tokens=30, reusable_tokens=0)
    load.routed(7, worker_id=1, input_tokens=100, reusable_tokens=64)
    assert (load.counts(0), load.counts(1), len(load)) == ((0, 0, 0), (2, 0, 30 + 36), 2)
    assert load.snapshot(1, "a100", None, 32).waiting_prefill == ((30, 0), (36, 64))  # FCFS: 7 is now last
    load.finished(7)
    assert (load.counts(1), len(load)) == ((1, 0, 30), 1)
