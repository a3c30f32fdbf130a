"""Tests of kvcost.serving.routing's decision store (the routing itself is covered through the API tests)."""

from kvcost.serving.routing import DecisionRecord, DecisionStore


def _record(worker_id: int) -> DecisionRecord:
    return DecisionRecord("run", worker_id, 100, 0, (0.0,) * 6, None)


def test_decision_store_forgets_the_oldest_and_reload_lets_the_newest_win():
    store = DecisionStore(max_decisions=2)
    store.reload([(1, _record(10)), (2, _record(20)), (1, _record(11))])
    assert len(store) == 2 and store.get(1).worker_id == 11 and store.get(2).worker_id == 20
    store.remember(3, _record(30))
    assert store.get(2) is None and [store.get(i).worker_id for i in (1, 3)] == [11, 30]
