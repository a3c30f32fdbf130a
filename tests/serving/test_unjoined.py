"""Tests for kvcost.serving.unjoined (the ids of observations recorded without a decision)."""

import asyncio

from kvcost.serving.unjoined import UnjoinedIds


def test_an_id_goes_from_unknown_to_committing_to_committed_and_the_oldest_go_first():
    ids = UnjoinedIds(max_ids=2)
    future = asyncio.Future(loop=asyncio.new_event_loop())
    assert ids.state(7) is False
    ids.committing(7, future)
    assert ids.state(7) is future
    ids.failed(7)
    assert ids.state(7) is False
    for request_id in (1, 2, 3):
        ids.committed(request_id)
    assert (ids.state(1), ids.state(2), ids.state(3), len(ids)) == (False, None, None, 2)
    ids.committed(2)  # seen again: newest now
    ids.committed(4)
    assert (ids.state(3), ids.state(2)) == (False, None)
