"""Tests for kvcost.serving.engines.kv_events (decoding, KVEventIngestor) and the directory methods it relies on.

Messages are built with msgspec exactly as vLLM's ``ZmqEventPublisher`` builds them:
the ``V09`` / ``V010`` / ``VMAP`` classes below copy the struct declarations of
``vllm/distributed/kv_events.py`` in three generations. vLLM declares ``tag=True``,
which tags with the class's ``__qualname__``: ``"BlockStored"`` for vLLM's
module-level classes, but ``"V09.BlockStored"`` for these nested copies, so the
copies spell the same tag out.
"""

import math
import random
from typing import Any

import msgspec
import pytest

from kvcost.core.types import DirectoryMatch, Namespace
from kvcost.routing.directory import CacheDirectory
from kvcost.serving.engines.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    IngestStats,
    KVEventDecodeError,
    KVEventIngestor,
    decode_batch,
    decode_event,
)

NS = Namespace("llama-3-8b", block_size_tokens=4)
ENCODER = msgspec.msgpack.Encoder()


class V09:
    """vLLM 0.9.0: array_like batch [ts, events] and tagged array events, no medium."""

    class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
        ts: float
        events: list[Any]

    class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
        pass

    class BlockStored(KVCacheEvent, tag="BlockStored"):
        block_hashes: list[int]
        parent_block_hash: int | None
        token_ids: list[int]
        block_size: int
        lora_id: int | None

    class BlockRemoved(KVCacheEvent, tag="BlockRemoved"):
        block_hashes: list[int]

    class AllBlocksCleared(KVCacheEvent, tag="AllBlocksCleared"):
        pass


class V010:
    """vLLM 0.10 – 0.2x: as V09 plus ``medium`` and the batch's ``data_parallel_rank``."""

    class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
        ts: float
        events: list[Any]
        data_parallel_rank: int | None = None

    class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
        pass

    class BlockStored(KVCacheEvent, tag="BlockStored"):
        block_hashes: list[int | bytes]
        parent_block_hash: int | bytes | None
        token_ids: list[int]
        block_size: int
        lora_id: int | None
        medium: str | None

    class BlockRemoved(KVCacheEvent, tag="BlockRemoved"):
        block_hashes: list[int | bytes]
        medium: str | None

    class AllBlocksCleared(KVCacheEvent, tag="AllBlocksCleared"):
        pass


class VMAP:
    """vLLM main after PR #42892: map batch, events tagged maps ({"type": ..., ...}) with the newest fields."""

    class EventBatch(msgspec.Struct, omit_defaults=True, gc=False):
        ts: float
        events: list[Any]
        data_parallel_rank: int | None = None

    class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
        pass

    class BlockStored(KVCacheEvent, tag="BlockStored"):
        block_hashes: list[int | bytes]
        parent_block_hash: int | bytes | None
        token_ids: list[int]
        block_size: int
        lora_id: int | None
        medium: str | None
        lora_name: str | None
        extra_keys: list[tuple[Any, ...] | None] | None = None
        group_idx: int | None = None
        kv_cache_spec_kind: str | None = None
        kv_cache_spec_sliding_window: int | None = None

    class BlockRemoved(KVCacheEvent, tag="BlockRemoved"):
        block_hashes: list[int | bytes]
        medium: str | None
        group_idx: int | None = None

    class AllBlocksCleared(KVCacheEvent, tag="AllBlocksCleared"):
        pass


def stored_map(hashes, parent=None, medium="GPU", lora_name=None, group_idx=0, block_size=4):
    tokens = list(range(block_size * len(hashes)))
    return VMAP.BlockStored(
        hashes, parent, tokens, block_size, None, medium, lora_name, [None] * len(hashes), group_idx, "full_attention"
    )


def frames(seq: int, payload: bytes, topic: bytes = b"kv-events") -> list[bytes]:
    return [topic, seq.to_bytes(8, "big"), payload]


def depths(directory, hashes, worker_ids=(0, 1), namespace=NS, now_s=10.0):
    return [m.reusable_blocks for m in directory.match(namespace, hashes, list(worker_ids), now_s)]


# -- decoding --------------------------------------------------------------------------------------


def test_decode_v09_array_batch():
    batch = V09.EventBatch(
        1.5,
        [
            V09.BlockStored([11, 12], None, list(range(8)), 4, None),
            V09.BlockRemoved([12]),
            V09.AllBlocksCleared(),
        ],
    )
    payload = ENCODER.encode(batch)
    assert payload[:2] == b"\x92\xcb"  # [ts (float64), events]
    decoded = decode_batch(payload)
    assert decoded.ts == 1.5 and decoded.data_parallel_rank is None
    assert decoded.events == (
        BlockStored([11, 12], None, list(range(8)), 4, None),
        BlockRemoved([12]),
        AllBlocksCleared(),
    )
    assert decoded.unknown_events == 0 and decoded.malformed_events == ()


def test_decode_v010_array_batch_with_medium_and_rank():
    batch = V010.EventBatch(2.0, [V010.BlockStored([1], 9, [0, 1, 2, 3], 4, 7, "CPU")], data_parallel_rank=3)
    decoded = decode_batch(ENCODER.encode(batch))
    (event,) = decoded.events
    assert (event.block_hashes, event.parent_block_hash, event.lora_id, event.medium) == ([1], 9, 7, "CPU")
    assert decoded.data_parallel_rank == 3


def test_decode_map_batch_ignores_unknown_keys():
    batch = VMAP.EventBatch(3.0, [stored_map([1, 2], lora_name="sql-lora"), VMAP.BlockRemoved([2], "GPU", 0)], 0)
    payload = ENCODER.encode(batch)
    assert payload[0] == 0x83  # a map of 3 entries
    decoded = decode_batch(payload)
    stored, removed = decoded.events
    assert (stored.block_hashes, stored.lora_name, stored.group_idx, stored.medium) == ([1, 2], "sql-lora", 0, "GPU")
    assert (removed.block_hashes, removed.medium, removed.group_idx) == ([2], "GPU", 0)
    # keys no release sends yet, in the batch and in an event
    future = {
        "ts": 4.0,
        "events": [{"type": "BlockRemoved", "block_hashes": [5], "medium": "GPU", "locality": "local"}],
        "epoch": 7,
    }
    assert decode_batch(ENCODER.encode(future)).events == (BlockRemoved([5], "GPU"),)


def test_decode_array_batch_of_map_events_and_extra_trailing_items():
    # vLLM 0.2x between the two changes: an array batch carrying map events
    payload = ENCODER.encode(V010.EventBatch(1.0, [stored_map([1]), VMAP.AllBlocksCleared()], 0))
    assert decode_batch(payload).events == (
        BlockStored([1], None, [0, 1, 2, 3], 4, None, "GPU", None, [None], 0),
        AllBlocksCleared(),
    )
    # trailing array items a newer release appends are ignored
    raw = ENCODER.encode(["BlockRemoved", [5], "GPU", 0, "future", 1])
    assert decode_event(raw) == BlockRemoved([5], "GPU", 0)


def test_unknown_event_types_are_counted_not_decoded():
    payload = ENCODER.encode(
        [
            1.0,
            [
                ["BlockTransferred", [1], "GPU", "CPU"],
                {"type": "BlockTransferred", "block_hashes": [1]},
                ["AllBlocksCleared"],
            ],
        ]
    )
    decoded = decode_batch(payload)
    assert decoded.events == (AllBlocksCleared(),)
    assert decoded.unknown_events == 2
    assert decoded.malformed_events == ()


@pytest.mark.parametrize(
    "event",
    [
        ["BlockStored", ["not-a-hash"], None, [], 4, None],  # wrong element type
        ["BlockStored"],  # missing block_hashes
        {"type": "BlockRemoved"},  # missing block_hashes
        {"type": 7, "block_hashes": [1]},  # tag not a string
        [],  # no tag
        42,  # not an event at all
    ],
)
def test_malformed_events_are_reported_and_the_rest_decoded(event):
    decoded = decode_batch(ENCODER.encode([1.0, [event, ["AllBlocksCleared"]]]))
    assert decoded.events == (AllBlocksCleared(),)
    assert len(decoded.malformed_events) == 1


@pytest.mark.parametrize(
    "payload",
    [b"", b"\xc1", b"\x92\xcb", ENCODER.encode(7), ENCODER.encode(["ts", []]), ENCODER.encode({"events": []})],
    ids=["empty", "invalid-opcode", "truncated", "int", "ts-not-float", "map-without-ts"],
)
def test_garbage_payloads_raise_decode_error(payload):
    with pytest.raises(KVEventDecodeError):
        decode_batch(payload)


# -- ingestion -------------------------------------------------------------------------------------


def make_ingestor(replay=None, namespace=NS):
    directory = CacheDirectory()
    return directory, KVEventIngestor(directory, lambda worker_id: namespace, replay=replay)


def v010(seq_events, ts=0.0):
    return ENCODER.encode(V010.EventBatch(ts, seq_events))


def test_ingest_applies_stored_removed_and_cleared():
    directory, ingestor = make_ingestor()
    assert ingestor.ingest(0, frames(0, v010([V010.BlockStored([1, 2, 3], None, [], 4, None, "GPU")])), now_s=1.0)
    assert ingestor.ingest(1, frames(0, v010([V010.BlockStored([1], None, [], 4, None, None)])), now_s=2.0)
    assert depths(directory, [1, 2, 3]) == [3, 1]
    assert ingestor.ingest(0, frames(1, v010([V010.BlockRemoved([3], "GPU")])), now_s=3.0)
    assert depths(directory, [1, 2, 3]) == [2, 1]
    assert ingestor.ingest(1, frames(1, v010([V010.AllBlocksCleared()])), now_s=4.0)
    assert directory.match(NS, [1, 2], [0, 1], now_s=5.0) == [
        DirectoryMatch(0, 2, "gpu", 2.0),
        DirectoryMatch(1, 0, "none", 1.0),
    ]
    s = ingestor.stats
    assert (s.messages, s.batches, s.events, s.blocks_stored, s.blocks_removed) == (4, 4, 4, 4, 1)
    assert (s.rejected, s.gaps, s.restarts) == (0, 0, 0)
    assert ingestor.expected_seq(0) == 2 and ingestor.expected_seq(7) is None


def test_all_blocks_cleared_empties_the_gpu_tier_only():
    # vLLM's reset_prefix_cache publishes AllBlocksCleared for its GPU block pool; the
    # offload connector's CPU copies survive it
    directory, ingestor = make_ingestor()
    batch = VMAP.EventBatch(0.0, [stored_map([1, 2]), stored_map([1], medium="CPU"), VMAP.AllBlocksCleared()])
    assert ingestor.ingest(0, frames(0, ENCODER.encode(batch)), now_s=0.0)
    assert directory.holders(NS, 1) == {0: ("cpu",)}
    assert directory.holders(NS, 2) == {}


def test_gpu_and_cpu_copies_of_a_block_are_tracked_per_tier():
    directory, ingestor = make_ingestor()
    batch = VMAP.EventBatch(0.0, [stored_map([1, 2]), stored_map([1, 2], medium="CPU")])
    ingestor.ingest(0, frames(0, ENCODER.encode(batch)), now_s=0.0)
    assert directory.holders(NS, 2) == {0: ("gpu", "cpu")}
    assert directory.match(NS, [1, 2], [0], now_s=0.0)[0].tier == "gpu"
    # the GPU evicts block 2; the CPU offload still holds it
    ingestor.ingest(0, frames(1, ENCODER.encode(VMAP.EventBatch(0.0, [VMAP.BlockRemoved([2], "GPU")]))), now_s=1.0)
    assert directory.match(NS, [1, 2], [0], now_s=1.0) == [DirectoryMatch(0, 2, "cpu", 0.0)]
    ingestor.ingest(0, frames(2, ENCODER.encode(VMAP.EventBatch(0.0, [VMAP.BlockRemoved([2], "cpu")]))), now_s=2.0)
    assert depths(directory, [1, 2], worker_ids=[0]) == [1]
    assert directory.num_blocks(NS) == 1


def test_byte_hashes_fold_to_the_low_64_bits():
    digest = bytes(range(32))
    low = int.from_bytes(digest[-8:], "big")
    directory, ingestor = make_ingestor()
    ingestor.ingest(0, frames(0, v010([V010.BlockStored([digest], None, [], 4, None, "GPU")])), now_s=0.0)
    assert depths(directory, [low], worker_ids=[0]) == [1]
    ingestor.ingest(0, frames(1, v010([V010.BlockRemoved([digest], "GPU")])), now_s=0.0)
    assert directory.num_blocks() == 0


def test_lora_blocks_go_to_the_adapter_namespace_and_are_removed_from_it():
    directory, ingestor = make_ingestor()
    batch = VMAP.EventBatch(0.0, [stored_map([1, 2], lora_name="sql-lora"), stored_map([3])])
    ingestor.ingest(0, frames(0, ENCODER.encode(batch)), now_s=0.0)
    lora = Namespace("llama-3-8b", adapter="sql-lora", block_size_tokens=4)
    assert depths(directory, [1, 2], worker_ids=[0], namespace=lora) == [2]
    assert depths(directory, [1, 2], worker_ids=[0], namespace=NS) == [0]
    assert depths(directory, [3], worker_ids=[0], namespace=NS) == [1]
    # BlockRemoved names no adapter: the hashes are found wherever the worker stored them
    ingestor.ingest(0, frames(1, ENCODER.encode(VMAP.EventBatch(0.0, [VMAP.BlockRemoved([2, 3], "GPU")]))), 1.0)
    assert depths(directory, [1, 2], worker_ids=[0], namespace=lora) == [1]
    assert directory.num_blocks() == 1
    # releases that send only lora_id use it as the adapter name
    ingestor.ingest(0, frames(2, v010([V010.BlockStored([8], None, [], 4, 5, "GPU")])), now_s=2.0)
    assert depths(directory, [8], worker_ids=[0], namespace=Namespace("llama-3-8b", adapter="5", block_size_tokens=4))


def test_other_kv_groups_are_skipped_and_bad_events_reject_and_mark_stale():
    directory, ingestor = make_ingestor()
    batch = VMAP.EventBatch(
        0.0,
        [
            stored_map([1], group_idx=1),  # sliding-window group of a hybrid model
            stored_map([2], medium="NVLINK-POOL"),  # unknown medium
            stored_map([3], block_size=16),  # not this namespace's block size
            stored_map([4]),
        ],
    )
    assert ingestor.ingest(0, frames(0, ENCODER.encode(batch)), now_s=0.0)
    assert [directory.num_blocks(NS), directory.holders(NS, 4)] == [1, {0: ("gpu",)}]
    s = ingestor.stats
    assert (s.events, s.skipped_events, s.rejected_events, s.rejected_messages) == (1, 1, 2, 0)
    assert directory.is_stale(0)


def test_counters_are_kept_per_worker_and_summed():
    _, ingestor = make_ingestor()
    ingestor.ingest(0, frames(0, v010([V010.BlockStored([1, 2], None, [], 4, None, "GPU")])), now_s=0.0)
    ingestor.ingest(0, frames(2, v010([V010.BlockRemoved([2], "GPU")])), now_s=0.0)  # gap, no replay
    ingestor.ingest(1, frames(0, b"garbage"), now_s=0.0)
    ingestor.ingest(1, frames(1, v010([V010.BlockStored([9], None, [], 4, None, "TAPE")])), now_s=0.0)
    w0, w1 = ingestor.worker_stats[0], ingestor.worker_stats[1]
    assert (w0.messages, w0.batches, w0.events, w0.blocks_stored, w0.blocks_removed, w0.gaps) == (2, 2, 2, 2, 1, 1)
    assert (w0.rejected, w0.replay_requests, w0.restarts) == (0, 0, 0)
    assert (w1.messages, w1.batches, w1.events, w1.rejected_messages, w1.rejected_events) == (2, 1, 0, 1, 1)
    assert ingestor.stats == IngestStats(
        messages=4,
        batches=3,
        events=2,
        blocks_stored=2,
        blocks_removed=1,
        rejected_messages=1,
        rejected_events=1,
        gaps=1,
    )


def test_incomplete_or_failing_replay_marks_stale():
    directory, ingestor = make_ingestor(replay=lambda worker_id, from_seq: [(2, v010([])), (3, b"\xc1")])
    ingestor.ingest(0, frames(0, v010([])), now_s=0.0)
    ingestor.ingest(0, frames(5, v010([])), now_s=0.0)  # 1 missing from the replay, 3 garbage, 4 missing
    assert directory.is_stale(0)
    assert (ingestor.stats.replayed_batches, ingestor.stats.rejected_messages) == (1, 1)

    def broken(worker_id, from_seq):
        raise ConnectionError("replay socket down")

    directory, ingestor = make_ingestor(replay=broken)
    ingestor.ingest(0, frames(0, v010([])), now_s=0.0)
    assert ingestor.ingest(0, frames(2, v010([V010.BlockStored([1], None, [], 4, None, "GPU")])), now_s=0.0)
    assert directory.is_stale(0) and depths(directory, [1], worker_ids=[0]) == [1]


@pytest.mark.parametrize(
    "message, stale",
    [
        ([b"only-one-frame"], False),
        ([b"topic", b"\x00\x01", v010([])], False),  # 2-byte sequence
        ([b"topic", (0).to_bytes(8, "big"), v010([]), b"extra"], False),
        (frames(0, b"\xc1 not msgpack"), True),  # a batch whose events are lost
        (frames(0, ENCODER.encode({"ts": "noon", "events": []})), True),
        (None, True),  # not even frames
    ],
)
def test_malformed_messages_are_counted_never_raised(message, stale):
    directory, ingestor = make_ingestor()
    assert ingestor.ingest(0, message, now_s=0.0) is False
    assert (ingestor.stats.messages, ingestor.stats.rejected_messages, ingestor.stats.batches) == (1, 1, 0)
    assert directory.is_stale(0) is stale
    assert directory.num_blocks() == 0


# -- directory support for ingestion and approximate mode -------------------------------------------


def test_stale_flag_is_reported_and_cleared_by_clear_worker():
    d = CacheDirectory()
    d.apply_stored(NS, 0, [1], parent_hash=None, tier="gpu", now_s=0.0)
    d.mark_stale(0)
    assert d.match(NS, [1], [0, 1], now_s=1.0) == [
        DirectoryMatch(0, 1, "gpu", 1.0, stale=True),
        DirectoryMatch(1, 0, "none", math.inf, stale=False),
    ]
    d.clear_worker(0, now_s=2.0)
    assert not d.is_stale(0)


def test_apply_removed_everywhere_drops_one_tier_or_all():
    other = Namespace("llama-3-8b", adapter="a", block_size_tokens=4)
    d = CacheDirectory()
    d.apply_stored(NS, 0, [1, 2], parent_hash=None, tier="gpu", now_s=0.0)
    d.apply_stored(NS, 0, [2], parent_hash=1, tier="disk", now_s=0.0)
    d.apply_stored(other, 0, [3], parent_hash=None, tier="gpu", now_s=0.0)
    d.apply_stored(NS, 1, [1], parent_hash=None, tier="cpu", now_s=0.0)
    d.apply_removed_everywhere(0, [2, 3], now_s=1.0, tier="gpu")
    assert [d.holders(NS, 2), d.holders(other, 3)] == [{0: ("disk",)}, {}]
    d.apply_removed_everywhere(0, [1, 2], now_s=1.0)
    assert [d.holders(NS, 1), d.holders(NS, 2), d.num_blocks()] == [{1: ("cpu",)}, {}, 1]
    with pytest.raises(ValueError):
        d.apply_removed_everywhere(0, [1], now_s=1.0, tier="GPU")


def test_many_holders_collapse_back_to_one():
    d = CacheDirectory()
    for worker_id in (0, 1, 2):
        d.apply_stored(NS, worker_id, [1, 2], parent_hash=None, tier="gpu", now_s=0.0)
    assert d.match(NS, [1, 2, 3], [2, 0, 5], now_s=0.0)[:2] == [
        DirectoryMatch(2, 2, "gpu", 0.0),
        DirectoryMatch(0, 2, "gpu", 0.0),
    ]
    d.apply_removed(NS, 0, [2], now_s=0.0)
    d.apply_removed(NS, 1, [2], now_s=0.0)
    assert depths(d, [1, 2], worker_ids=[0, 1, 2]) == [1, 1, 2]
    assert d.holders(NS, 2) == {2: ("gpu",)}
    d.clear_worker(2, now_s=0.0)
    assert [d.holders(NS, 1), d.num_blocks()] == [{0: ("gpu",), 1: ("gpu",)}, 1]


def test_record_routed_then_expire_after_ttl():
    d = CacheDirectory()
    d.record_routed(NS, 3, [1, 2, 3], now_s=0.0)
    d.record_routed(NS, 3, [1, 2], now_s=5.0)  # block 3 not routed again
    d.record_routed(NS, 4, [1], now_s=6.0)
    assert d.match(NS, [1, 2, 3], [3, 4], now_s=6.0) == [
        DirectoryMatch(3, 3, "gpu", 1.0),
        DirectoryMatch(4, 1, "gpu", 0.0),
    ]
    assert d.expire_routed(now_s=10.0, ttl_s=10.0) == 0  # routed at 0, exactly the TTL old: kept
    assert d.expire_routed(now_s=10.5, ttl_s=10.0) == 1  # block 3 of worker 3
    assert depths(d, [1, 2, 3], worker_ids=[3, 4]) == [2, 1]
    assert d.expire_routed(now_s=16.5, ttl_s=10.0) == 3
    assert d.num_blocks() == 0


class ReferenceDirectory:
    """The directory's semantics, naively: hash -> worker -> set of tiers, matched block by block."""

    def __init__(self):
        self.blocks = {}

    def stored(self, worker_id, hashes, tier):
        for h in hashes:
            self.blocks.setdefault(h, {}).setdefault(worker_id, set()).add(tier)

    def removed(self, worker_id, hashes, tier=None):
        for h in hashes:
            tiers = self.blocks.get(h, {}).get(worker_id)
            if tiers is not None:
                tiers.difference_update([tier] if tier else list(tiers))
                if not tiers:
                    del self.blocks[h][worker_id]
                    if not self.blocks[h]:
                        del self.blocks[h]

    def cleared(self, worker_id):
        self.removed(worker_id, list(self.blocks))

    def match(self, hashes, worker_ids):
        out = []
        for w in worker_ids:
            n = 0
            while n < len(hashes) and w in self.blocks.get(hashes[n], {}):
                n += 1
            tiers = self.blocks[hashes[n - 1]][w] if n else {"none"}
            out.append((n, min(tiers, key=["none", "gpu", "cpu", "disk", "remote"].index)))
        return out


@pytest.mark.parametrize("seed", range(8))
def test_random_event_streams_match_the_reference_semantics(seed):
    rng = random.Random(seed)
    d, ref = CacheDirectory(), ReferenceDirectory()
    trunks = [[rng.getrandbits(64) for _ in range(40)] for _ in range(3)]  # shared prompt chains
    workers = [0, 1, 2, 3, 700]
    for step in range(400):
        op = rng.random()
        worker_id = rng.choice(workers)
        trunk = rng.choice(trunks)
        lo = rng.randrange(len(trunk))
        hashes = trunk[lo : lo + rng.choice([1, 1, 2, 5, 11])]
        parent = trunk[lo - 1] if lo else None
        if op < 0.08:  # a chain nobody has, with a prefix of a trunk
            hashes = trunk[: rng.randrange(1, 8)] + [rng.getrandbits(64) for _ in range(rng.randrange(1, 30))]
            trunks.append(hashes)
            parent = None
        if op < 0.55:
            tier = rng.choice(["gpu", "gpu", "cpu", "disk"])
            parent = parent if rng.random() < 0.9 else rng.choice([None, hashes[-1], rng.getrandbits(64)])
            d.apply_stored(NS, worker_id, hashes, parent, tier, float(step))
            ref.stored(worker_id, hashes, tier)
        elif op < 0.8:
            tier = rng.choice([None, "gpu", "cpu"])
            hashes = list(reversed(hashes)) if rng.random() < 0.7 else hashes  # tail-first, as vLLM evicts
            d.apply_removed_everywhere(worker_id, hashes, float(step), tier=tier)
            ref.removed(worker_id, hashes, tier)
        elif op < 0.95:
            d.apply_removed(NS, worker_id, hashes, float(step))
            ref.removed(worker_id, hashes)
        else:
            d.clear_worker(worker_id, float(step))
            ref.cleared(worker_id)
        for _ in range(3):
            trunk = rng.choice(trunks)
            request = trunk[: rng.randrange(0, len(trunk) + 1)] + [rng.getrandbits(64)] * rng.randrange(2)
            got = [(m.reusable_blocks, m.tier) for m in d.match(NS, request, workers, float(step))]
            assert got == ref.match(request, workers), (seed, step)
    assert d.num_blocks() == len(ref.blocks)
    for h, holders in ref.blocks.items():
        order = ["gpu", "cpu", "disk", "remote"]
        assert d.holders(NS, h) == {w: tuple(sorted(t, key=order.index)) for w, t in holders.items()}


@pytest.mark.parametrize("seed", range(8))
def test_vllm_like_streams_match_the_reference_semantics(seed):
    """Workers store chains chunk by chunk (prefill chunks, then decode blocks, each naming its parent),
    evict tails, offload to CPU and clear; lookups walk the chains (exercises run extension and skipping)."""
    rng = random.Random(100 + seed)
    d, ref = CacheDirectory(), ReferenceDirectory()
    trunks = [[rng.getrandbits(64) for _ in range(rng.randrange(20, 120))] for _ in range(6)]
    workers = [0, 1, 2]
    stored_upto = {(w, t): 0 for w in workers for t in range(len(trunks))}
    for step in range(300):
        worker_id, t = rng.choice(workers), rng.randrange(len(trunks))
        trunk, upto = trunks[t], stored_upto[(worker_id, t)]
        op = rng.random()
        if op < 0.6 and upto < len(trunk):
            n = rng.choice([1, 1, 1, 16, 32])  # decode block or prefill chunk
            hashes = trunk[upto : upto + n]
            d.apply_stored(NS, worker_id, hashes, trunk[upto - 1] if upto else None, "gpu", float(step))
            ref.stored(worker_id, hashes, "gpu")
            stored_upto[(worker_id, t)] = upto + len(hashes)
        elif op < 0.8 and upto:
            n = rng.randrange(1, upto + 1)  # evict the tail, last block first
            hashes = list(reversed(trunk[upto - n : upto]))
            d.apply_removed_everywhere(worker_id, hashes, float(step), tier="gpu")
            ref.removed(worker_id, hashes, "gpu")
            stored_upto[(worker_id, t)] = upto - n
        elif op < 0.9 and upto:
            lo = rng.randrange(upto)  # offload a middle piece to CPU
            hashes = trunk[lo : lo + rng.randrange(1, 8)]
            d.apply_stored(NS, worker_id, hashes, trunk[lo - 1] if lo else None, "cpu", float(step))
            ref.stored(worker_id, hashes, "cpu")
        elif op < 0.93:
            d.clear_worker(worker_id, float(step))
            ref.cleared(worker_id)
            for key in stored_upto:
                if key[0] == worker_id:
                    stored_upto[key] = 0
        for _ in range(3):
            trunk = rng.choice(trunks)
            request = trunk[: rng.randrange(0, len(trunk) + 1)]
            got = [(m.reusable_blocks, m.tier) for m in d.match(NS, request, workers, float(step))]
            assert got == ref.match(request, workers), (seed, step)
