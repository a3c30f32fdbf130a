"""Tests for kvcost.serving.gateway.engines: failure backoff of the engines behind the gateway."""

import pytest

from kvcost.serving.gateway.engines import EnginePool


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_a_failed_engine_backs_off_doubling_up_to_the_cap_and_a_success_clears_it():
    clock = Clock()
    pool = EnginePool({1: "http://e1", 0: "http://e0"}, clock, backoff_s=1.0, backoff_max_s=3.0)
    assert pool.worker_ids == [0, 1] and pool.available() == [0, 1]
    assert [pool.failed(1, "refused") for _ in range(3)] == [1.0, 2.0, 3.0]
    assert pool.available() == [0] and pool.backing_off() == {1: "refused"}
    clock.now_s += 3.0  # the backoff is served: the next request is a probe
    assert pool.available() == [0, 1]
    pool.failed(1, "refused")
    assert pool.available() == [0]
    pool.succeeded(1)
    assert pool.available() == [0, 1] and pool.backing_off() == {}


def test_when_every_engine_backs_off_all_are_candidates_and_exclusions_hold():
    pool = EnginePool({0: "http://e0", 1: "http://e1"}, Clock())
    pool.failed(0, "timeout")
    pool.failed(1, "timeout")
    assert pool.available() == [0, 1]
    assert pool.available(exclude=[0]) == [1]
    assert pool.available(exclude=[0, 1]) == []


@pytest.mark.parametrize(("urls", "first", "cap"), [({}, 1.0, 2.0), ({0: "http://e0"}, 0.0, 1.0), ({0: "x"}, 2.0, 1.0)])
def test_bad_construction_is_refused(urls, first, cap):
    with pytest.raises(ValueError, match="urls is empty|backoff_s"):
        EnginePool(urls, Clock(), first, cap)
