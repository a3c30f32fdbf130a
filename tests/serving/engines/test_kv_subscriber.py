"""Tests for kvcost.serving.engines.kv_subscriber: real ZMQ sockets on loopback, vLLM-format messages.

``FakeEngine`` is the publishing half of vLLM's ``ZmqEventPublisher``: a PUB-side
socket sending ``[topic, seq (8 bytes big-endian), msgpack EventBatch]`` and a
ROUTER replay socket that answers ``[b"", start_seq]`` with one
``[b"", topic, seq, payload]`` per buffered batch from ``start_seq`` on, then
``[b"", b"", -1, b""]`` (vLLM 0.32; ``topic_in_replay=False``: the earlier
``[b"", seq, payload]`` and ``[b"", -1, b""]``). The PUB side is an XPUB socket: the same wire protocol as PUB
(vLLM's), but it also receives the subscriber's subscription, so a test knows
when the subscriber is connected instead of sleeping.
"""

import math
import threading
import time

import msgspec
import pytest
import zmq

from kvcost.core.types import DirectoryMatch, Namespace
from kvcost.routing.directory import CacheDirectory
from kvcost.serving.engines.kv_events import KVEventIngestor
from kvcost.serving.engines.kv_subscriber import KVEventSource, KVEventSubscriber, replay_reply
from tests.serving.engines.test_kv_events import V010, VMAP, stored_map

NS = Namespace("llama-3-8b", block_size_tokens=4)
TOPIC = b"kv-events"
ENCODER = msgspec.msgpack.Encoder()
WAIT_S = 2.0  # longest bounded wait of any step


class FakeEngine:
    """vLLM's publisher sockets, driven by the test thread."""

    def __init__(
        self,
        context: zmq.Context,
        topic: bytes = TOPIC,
        replay: bool = False,
        connect: str | None = None,
        topic_in_replay: bool = True,
    ):
        self.topic = topic
        self.topic_in_replay = topic_in_replay
        self.pub = context.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        if connect is None:
            port = self.pub.bind_to_random_port("tcp://127.0.0.1")
            self.endpoint = f"tcp://127.0.0.1:{port}"
        else:
            self.pub.connect(connect)
        self.router = None
        self.replay_endpoint = None
        if replay:
            self.router = context.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            port = self.router.bind_to_random_port("tcp://127.0.0.1")
            self.replay_endpoint = f"tcp://127.0.0.1:{port}"
        self.buffer: list[tuple[int, bytes]] = []

    def wait_subscribed(self) -> bytes:
        assert self.pub.poll(int(WAIT_S * 1000)), "subscriber never subscribed"
        return self.pub.recv()

    def publish(self, seq: int, batch, send: bool = True) -> None:
        """Encode ``batch`` as vLLM does, keep it for replay, and send it unless it is to be 'lost'."""
        payload = ENCODER.encode(batch)
        self.buffer.append((seq, payload))
        if send:
            self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])

    def send_raw(self, frames: list[bytes]) -> None:
        self.pub.send_multipart(frames)

    def serve_one_replay(self) -> int:
        """Answer one replay request as ``ZmqEventPublisher._service_replay`` does; returns its start seq."""
        assert self.router.poll(int(WAIT_S * 1000)), "no replay request"
        client, empty, start = self.router.recv_multipart()
        assert empty == b""
        start_seq = int.from_bytes(start, "big")
        topic = [self.topic] if self.topic_in_replay else []
        for seq, payload in self.buffer:
            if seq >= start_seq:
                self.router.send_multipart([client, b"", *topic, seq.to_bytes(8, "big"), payload])
        end = [b""] if self.topic_in_replay else []
        self.router.send_multipart([client, b"", *end, (-1).to_bytes(8, "big", signed=True), b""])
        return start_seq

    def close(self) -> None:
        self.pub.close(linger=0)
        if self.router is not None:
            self.router.close(linger=0)


@pytest.fixture
def context():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def wait_for(subscriber: KVEventSubscriber, messages: int) -> None:
    """Wait (bounded) until the subscriber has handed ``messages`` messages to its ingestor."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        with subscriber.lock:
            if subscriber.stats.messages + subscriber.unknown_topic_messages >= messages:
                return
        time.sleep(0.002)
    raise AssertionError(f"only {subscriber.stats.messages} of {messages} messages arrived")


def match(subscriber, hashes, worker_ids, now_s=101.0):
    with subscriber.lock:
        return subscriber.ingestor.directory.match(NS, hashes, worker_ids, now_s)


def stored(hashes, parent=None, medium="GPU"):
    return V010.BlockStored(hashes, parent, list(range(4 * len(hashes))), 4, None, medium)


def test_connected_engines_both_encodings_gap_replay_restart_and_garbage(context):
    # array encoding (vLLM 0.10 – 0.2x), with a replay socket in their 3-frame layout
    a = FakeEngine(context, replay=True, topic_in_replay=False)
    b = FakeEngine(context)  # map encoding (vLLM main), no replay socket
    ingestor = KVEventIngestor(CacheDirectory(), lambda worker_id: NS)
    subscriber = KVEventSubscriber(
        ingestor,
        [
            KVEventSource(0, a.endpoint, topic="kv-events", replay_endpoint=a.replay_endpoint),
            KVEventSource(1, b.endpoint, topic="kv-events"),
        ],
        clock=lambda: 100.0,
        replay_timeout_s=1.0,
        context=context,
    )
    started = time.monotonic()
    with subscriber:
        assert a.wait_subscribed() == b"\x01kv-events"
        assert b.wait_subscribed() == b"\x01kv-events"

        # worker 0: batches 1 and 2 are lost on the wire, batch 3 reveals the gap
        a.publish(0, V010.EventBatch(1.0, [stored([1, 2, 3])], 0))
        a.publish(1, V010.EventBatch(1.1, [stored([4], parent=3)], 0), send=False)
        a.publish(2, V010.EventBatch(1.2, [V010.BlockRemoved([4], "GPU")], 0), send=False)
        a.publish(3, V010.EventBatch(1.3, [stored([5])], 0))
        assert a.serve_one_replay() == 1
        wait_for(subscriber, 2)
        assert match(subscriber, [1, 2, 3, 4], [0]) == [DirectoryMatch(0, 3, "gpu", 1.0)]
        assert match(subscriber, [5], [0]) == [DirectoryMatch(0, 1, "gpu", 1.0)]

        # worker 0: garbage frames, then the engine restarts (sequence back to 0)
        a.send_raw([TOPIC, b"\x00"])
        a.send_raw([TOPIC, b"123", b"\x90"])
        a.publish(0, V010.EventBatch(2.0, [stored([7])], 0))
        a.publish(1, V010.EventBatch(2.1, [stored([8], parent=7)], 0))

        # worker 1: a GPU copy and a CPU copy, the GPU one evicted, a lost batch, an unknown event, garbage
        b.publish(0, VMAP.EventBatch(1.0, [stored_map([1, 2]), stored_map([1, 2], medium="CPU")], 0))
        b.publish(1, VMAP.EventBatch(1.1, [VMAP.BlockRemoved([2], "GPU", 0)], 0))
        b.publish(2, VMAP.EventBatch(1.2, [VMAP.BlockRemoved([1], "GPU", 0)], 0), send=False)
        future_event = {"type": "BlockTransferred", "block_hashes": [9], "from_medium": "GPU", "to_medium": "CPU"}
        b.publish(3, VMAP.EventBatch(1.3, [stored_map([9]), future_event], 0))
        b.send_raw([TOPIC, (4).to_bytes(8, "big"), b"\xc1 not msgpack"])
        wait_for(subscriber, 10)

        assert match(subscriber, [1, 2], [0, 1]) == [
            DirectoryMatch(0, 0, "none", 1.0),  # everything before the restart is gone
            DirectoryMatch(1, 2, "cpu", 1.0, stale=True),  # block 2 survives in the CPU tier only
        ]
        assert match(subscriber, [7, 8], [0, 1]) == [
            DirectoryMatch(0, 2, "gpu", 1.0),
            DirectoryMatch(1, 0, "none", 1.0, stale=True),
        ]
        assert match(subscriber, [1], [1])[0].tier == "gpu"  # the lost removal of block 1 never arrived
        assert match(subscriber, [9], [1, 2]) == [
            DirectoryMatch(1, 1, "gpu", 1.0, stale=True),
            DirectoryMatch(2, 0, "none", math.inf),
        ]
        with subscriber.lock:
            stats = subscriber.stats
            assert (stats.messages, stats.batches, stats.events, stats.blocks_stored, stats.blocks_removed) == (
                10,
                9,
                10,
                12,
                2,
            )
            assert (stats.rejected_messages, stats.rejected_events, stats.unknown_events) == (3, 0, 1)
            assert (stats.gaps, stats.replayed_batches, stats.restarts) == (2, 2, 1)
            assert subscriber.ingestor.directory.num_blocks(NS) == 5  # 1, 2, 7, 8, 9
    assert not any(t.name == "kvcost-kv-events" for t in threading.enumerate())
    assert time.monotonic() - started < 5.0
    a.close()
    b.close()


def test_bound_endpoint_maps_topics_to_workers(context):
    ingestor = KVEventIngestor(CacheDirectory(), lambda worker_id: NS)
    subscriber = KVEventSubscriber(
        ingestor,
        [KVEventSource(5, topic="w5"), KVEventSource(6, topic="w6")],
        bind="tcp://127.0.0.1:*",
        clock=lambda: 100.0,
        context=context,
    )
    with subscriber:
        assert subscriber.bound_endpoint.startswith("tcp://127.0.0.1:")
        engines = [FakeEngine(context, topic=t, connect=subscriber.bound_endpoint) for t in (b"w5", b"w6", b"w55")]
        for engine in engines:
            assert engine.wait_subscribed() in (b"\x01w5", b"\x01w6")
        engines[0].publish(0, V010.EventBatch(1.0, [stored([1, 2])]))
        engines[1].publish(0, VMAP.EventBatch(1.0, [stored_map([1])]))
        engines[2].publish(0, V010.EventBatch(1.0, [stored([1, 2, 3])]))  # passes the "w5" prefix filter only
        wait_for(subscriber, 3)
        assert [m.reusable_blocks for m in match(subscriber, [1, 2, 3], [5, 6, 55])] == [2, 1, 0]
        with subscriber.lock:
            assert (subscriber.stats.messages, subscriber.unknown_topic_messages) == (2, 1)
    for engine in engines:
        engine.close()


def test_constructor_checks_and_lifecycle(context):
    ingestor = KVEventIngestor(CacheDirectory(), lambda worker_id: NS)
    with pytest.raises(ValueError, match="sources is empty"):
        KVEventSubscriber(ingestor, [])
    with pytest.raises(ValueError, match="has no endpoint and bind is None"):
        KVEventSubscriber(ingestor, [KVEventSource(0)])
    with pytest.raises(ValueError, match="distinct topics"):
        KVEventSubscriber(ingestor, [KVEventSource(0), KVEventSource(1)], bind="tcp://127.0.0.1:*")
    subscriber = KVEventSubscriber(
        ingestor, [KVEventSource(0, "tcp://127.0.0.1:1", replay_endpoint="tcp://127.0.0.1:2")], context=context
    )
    assert ingestor.replay is not None
    with pytest.raises(ValueError, match="already has a replay callback"):
        KVEventSubscriber(ingestor, [KVEventSource(0, "tcp://127.0.0.1:1", replay_endpoint="tcp://127.0.0.1:2")])
    subscriber.start()
    with pytest.raises(RuntimeError, match="already started"):
        subscriber.start()
    subscriber.stop()
    subscriber.stop()  # idempotent
    assert not any(t.name == "kvcost-kv-events" for t in threading.enumerate())


def test_readers_are_not_blocked_during_a_replay_and_a_silent_replay_times_out(context):
    engine = FakeEngine(context, replay=True)
    ingestor = KVEventIngestor(CacheDirectory(), lambda worker_id: NS)
    subscriber = KVEventSubscriber(
        ingestor,
        [KVEventSource(0, engine.endpoint, replay_endpoint=engine.replay_endpoint)],
        clock=lambda: 100.0,
        replay_timeout_s=0.2,
        context=context,
    )
    with subscriber:
        engine.wait_subscribed()
        engine.publish(0, V010.EventBatch(1.0, [stored([1])]))
        engine.publish(1, V010.EventBatch(1.0, [stored([2], parent=1)]), send=False)
        engine.publish(2, V010.EventBatch(1.0, [stored([3], parent=2)]))
        assert engine.router.poll(int(WAIT_S * 1000))  # the subscriber is waiting for the replay now
        assert subscriber.lock.acquire(timeout=0.1)  # ... without holding the lock
        try:  # batch 2 is not applied yet
            assert ingestor.directory.match(NS, [1, 2, 3], [0], 101.0) == [DirectoryMatch(0, 1, "gpu", 1.0)]
        finally:
            subscriber.lock.release()
        assert engine.serve_one_replay() == 1
        wait_for(subscriber, 2)
        assert match(subscriber, [1, 2, 3], [0]) == [DirectoryMatch(0, 3, "gpu", 1.0)]

        # the next gap: the engine does not answer, the replay times out, the worker is stale
        engine.publish(3, V010.EventBatch(1.0, [stored([4], parent=3)]), send=False)
        engine.publish(4, V010.EventBatch(1.0, [stored([5], parent=4)]))
        wait_for(subscriber, 3)
        assert match(subscriber, [1, 2, 3, 4], [0]) == [DirectoryMatch(0, 3, "gpu", 1.0, stale=True)]
        with subscriber.lock:
            assert (subscriber.stats.gaps, subscriber.stats.replayed_batches) == (2, 1)
    engine.close()


def test_replay_reply_reads_both_layouts_and_refuses_others():
    seq7 = (7).to_bytes(8, "big")
    end = (-1).to_bytes(8, "big", signed=True)
    assert replay_reply([b"", b"kv", seq7, b"payload"]) == (7, b"payload")  # vLLM 0.32
    assert replay_reply([b"", b"", end, b""]) == (-1, b"")
    assert replay_reply([b"", seq7, b"payload"]) == (7, b"payload")  # earlier releases
    assert replay_reply([b"", end, b""]) == (-1, b"")
    assert replay_reply([b"", b"kv", b"\x07", b"payload"]) is None  # sequence not 8 bytes
    assert replay_reply([b"x", seq7, b"payload"]) is None  # no empty delimiter
    assert replay_reply([b"", seq7]) is None


def _captured():
    """Frames captured from a real vLLM 0.32 engine (tests/e2e/capture_frames.py; its ``source`` says how)."""
    import base64
    import json
    from pathlib import Path

    data = json.loads((Path(__file__).parent / "data" / "vllm_0_32_frames.json").read_text())
    decode = lambda message: [base64.b64decode(f) for f in message["frames"]]  # noqa: E731
    return [decode(m) for m in data["live"]], [decode(m) for m in data["replay"]]


def test_real_vllm_0_32_frames_apply_live_and_a_missed_batch_is_recovered_from_its_replay_replies():
    live, replies = _captured()
    ns = Namespace("tiny", block_size_tokens=32)
    whole = KVEventIngestor(CacheDirectory(), lambda worker_id: ns)
    for seq, frames in enumerate(live):
        assert whole.ingest(0, frames, now_s=float(seq))
    assert (whole.stats.rejected, whole.stats.unknown_events, whole.stats.batches) == (0, 0, 9)
    # batch 2 is lost on the way; the engine's replay socket answers with its real 4-frame replies
    parsed = [replay_reply(frames) for frames in replies]
    assert [seq for seq, _ in parsed] == [*range(9), -1]
    replayed = KVEventIngestor(CacheDirectory(), lambda worker_id: ns, replay=lambda w, start: parsed[start:-1])
    for seq, frames in enumerate(live):
        if seq != 2:
            assert replayed.ingest(0, frames, now_s=float(seq))
    stats = replayed.stats
    assert (stats.gaps, stats.replayed_batches, stats.rejected, stats.batches) == (1, 1, 0, 9)
    assert not replayed.directory.is_stale(0)
    assert replayed.directory.num_blocks() == whole.directory.num_blocks()
