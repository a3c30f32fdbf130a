"""Tests for kvcost.serving.engines.kv_events: block hashes the engines' hash algorithm cannot emit are refused."""

import pytest

from kvcost.routing.block_hash import external_hash
from kvcost.routing.directory import CacheDirectory
from kvcost.serving.engines.kv_events import KVEventIngestor
from tests.serving.engines.test_kv_events import NS, V010, depths, frames, v010


def stored(hashes, parent=None):
    return frames(0, v010([V010.BlockStored(hashes, parent, [], 4, None, "GPU")]))


@pytest.mark.parametrize(
    "algorithm, hashes, parent",
    [
        ("sha256", [7, 8], None),  # vLLM's ints: a digest's low 64 bits
        ("sha256", [b"\x01" * 32, 8], None),  # digests, as releases that send bytes do
        ("sha256", [7, b"\x02" * 32, 9], b"\x03" * 32),  # a digest among ints, and a digest parent
        ("xxhash", [b"\x01" * 16], None),  # XXH3-128
    ],
)
def test_hashes_the_algorithm_emits_are_applied(algorithm, hashes, parent):
    directory = CacheDirectory()
    ingestor = KVEventIngestor(directory, lambda worker_id: NS, hash_algorithm=algorithm)
    assert ingestor.ingest(0, stored(hashes, parent), now_s=1.0)
    ints = [external_hash(h) if type(h) is bytes else h for h in hashes]
    assert depths(directory, ints, worker_ids=(0,)) == [len(ints)]
    assert ingestor.stats.rejected_events == 0


@pytest.mark.parametrize(
    "algorithm, hashes, parent, reason",
    [
        ("sha256", [7, -3], None, "block hash -3 is negative"),  # Python's hash(), older releases
        ("sha256", [b"\x01" * 16], None, "block hash of 16 bytes; the configured algorithm's digest has 32"),
        ("xxhash", [b"\x01" * 32], None, "block hash of 32 bytes; the configured algorithm's digest has 16"),
        ("sha256", [7, 8], -1, "block hash -1: expected 0 … 2^64−1 or a 32-byte digest"),
    ],
)
def test_hashes_the_algorithm_cannot_emit_reject_the_event_and_mark_the_worker_stale(
    algorithm, hashes, parent, reason, caplog
):
    directory = CacheDirectory()
    ingestor = KVEventIngestor(directory, lambda worker_id: NS, hash_algorithm=algorithm)
    ingestor.ingest(0, stored(hashes, parent), now_s=1.0)
    assert (ingestor.stats.rejected_events, directory.num_blocks(), directory.is_stale(0)) == (1, 0, True)
    assert reason in caplog.text
