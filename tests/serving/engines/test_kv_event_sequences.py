"""Tests for kvcost.serving.engines.kv_events: sequence numbers (gaps and their replay, restarts, forged
jumps). The message helpers are those of tests/serving/engines/test_kv_events.py."""

from kvcost.core.types import DirectoryMatch
from tests.serving.engines.test_kv_events import NS, V010, depths, frames, make_ingestor, v010


def test_gap_without_replay_marks_the_worker_stale():
    directory, ingestor = make_ingestor()
    ingestor.ingest(0, frames(0, v010([V010.BlockStored([1], None, [], 4, None, "GPU")])), now_s=0.0)
    ingestor.ingest(0, frames(3, v010([V010.BlockStored([2], 1, [], 4, None, "GPU")])), now_s=1.0)
    assert directory.match(NS, [1, 2], [0], now_s=1.0) == [DirectoryMatch(0, 2, "gpu", 0.0, stale=True)]
    assert (ingestor.stats.gaps, ingestor.expected_seq(0)) == (1, 4)


def test_gap_is_filled_from_the_replay_before_the_new_batch():
    published = {
        0: v010([V010.BlockStored([1], None, [], 4, None, "GPU")]),
        1: v010([V010.BlockStored([2], 1, [], 4, None, "GPU")]),
        2: v010([V010.BlockRemoved([1], "GPU")]),
        3: v010([V010.BlockStored([1], None, [], 4, None, "GPU")]),
    }
    calls = []

    def replay(worker_id, from_seq):
        calls.append((worker_id, from_seq))
        return [(seq, published[seq]) for seq in sorted(published) if seq >= from_seq]

    directory, ingestor = make_ingestor(replay=replay)
    ingestor.ingest(4, frames(0, published[0]), now_s=0.0)
    ingestor.ingest(4, frames(3, published[3]), now_s=1.0)  # 1 and 2 were lost
    assert calls == [(4, 1)]
    # replayed: 2 stored, 1 removed; then live 3: 1 stored again → the full chain
    assert directory.match(NS, [1, 2], [4], now_s=1.0) == [DirectoryMatch(4, 2, "gpu", 0.0)]
    s = ingestor.stats
    assert (s.gaps, s.replay_requests, s.replayed_batches, s.batches, s.events) == (1, 1, 2, 4, 4)


def test_sequence_going_back_is_a_restart():
    directory, ingestor = make_ingestor()
    ingestor.ingest(0, frames(0, v010([V010.BlockStored([1, 2], None, [], 4, None, "GPU")])), now_s=0.0)
    ingestor.ingest(0, frames(1, v010([V010.BlockStored([5], None, [], 4, None, "GPU")])), now_s=0.0)
    ingestor.ingest(0, frames(0, v010([V010.BlockStored([7], None, [], 4, None, "GPU")])), now_s=3.0)
    assert [depths(directory, [1], [0]), depths(directory, [5], [0]), depths(directory, [7], [0])] == [[0], [0], [1]]
    assert (ingestor.stats.restarts, ingestor.expected_seq(0)) == (1, 1)


def test_a_forged_sequence_jump_is_rejected_and_the_stream_goes_on():
    directory, ingestor = make_ingestor()
    ingestor.ingest(0, frames(0, v010([V010.BlockStored([1], None, [], 4, None, "GPU")])), now_s=0.0)
    forged = v010([V010.BlockStored([9], None, [], 4, None, "GPU")])
    assert not ingestor.ingest(0, frames(2**64 - 1, forged), now_s=1.0)
    assert ingestor.ingest(0, frames(1, v010([V010.BlockStored([2], 1, [], 4, None, "GPU")])), now_s=2.0)
    # neither a restart (the worker kept its blocks) nor stale, and the forged block was not applied
    assert directory.match(NS, [1, 2], [0], now_s=2.0) == [DirectoryMatch(0, 2, "gpu", 0.0)]
    assert directory.match(NS, [9], [0], now_s=2.0)[0].reusable_blocks == 0
    s = ingestor.stats
    assert (s.rejected_messages, s.restarts, s.gaps, ingestor.expected_seq(0)) == (1, 0, 0, 2)


def test_a_long_genuine_gap_is_confirmed_by_the_next_message_and_marks_stale():
    directory, ingestor = make_ingestor()
    ingestor.ingest(0, frames(0, v010([V010.BlockStored([1], None, [], 4, None, "GPU")])), now_s=0.0)
    assert not ingestor.ingest(0, frames(20_000, v010([])), now_s=1.0)  # more than the replay buffer
    assert ingestor.ingest(0, frames(20_001, v010([V010.BlockStored([2], 1, [], 4, None, "GPU")])), now_s=2.0)
    assert directory.match(NS, [1, 2], [0], now_s=2.0) == [DirectoryMatch(0, 2, "gpu", 0.0, stale=True)]
    assert (ingestor.stats.gaps, ingestor.expected_seq(0)) == (1, 20_002)
