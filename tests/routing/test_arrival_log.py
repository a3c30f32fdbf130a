"""Tests for kvcost.routing.arrival_log.ArrivalLog."""

import pytest

from kvcost.routing.arrival_log import ArrivalLog


def test_window_counts_arrivals_and_their_prefill_in_a_half_open_interval():
    log = ArrivalLog()
    for time_s, prefill_s in [(0.0, 0.5), (1.0, 0.25), (1.0, 0.125), (3.0, 1.0)]:
        log.add(time_s, prefill_s, ())
    assert log.window(0.0, 3.0) == (3, 0.875)
    assert log.window(1.0, 3.5) == (3, 1.375)
    assert log.window(0.5, 1.0) == (0, 0.0)  # the end is excluded
    assert log.window(4.0, 2.0) == (0, 0.0)


def test_carrying_counts_each_arrival_once_per_block_hash():
    log = ArrivalLog()
    log.add(0.0, 0.1, (7, 8, 7))  # a hash repeated in one prompt counts once
    log.add(2.0, 0.1, (7, 9))
    assert [log.carrying(7, 0.0, 3.0), log.carrying(8, 0.0, 3.0), log.carrying(9, 0.0, 2.0)] == [2, 1, 0]
    assert log.carrying(42, 0.0, 3.0) == 0


def test_arrivals_older_than_the_horizon_are_dropped_with_their_hashes():
    log = ArrivalLog(horizon_s=10.0)
    log.add(0.0, 0.5, (1, 2))
    log.add(5.0, 0.25, (1,))
    log.add(12.0, 1.0, (3,))  # drops the arrival at 0 s (before 12 − 10)
    assert len(log) == 2
    assert log.window(0.0, 13.0) == (2, 1.25)
    assert [log.carrying(1, 0.0, 13.0), log.carrying(2, 0.0, 13.0)] == [1, 0]
    assert 2 not in log._by_hash


@pytest.mark.parametrize(
    ("time_s", "prefill_s", "message"),
    [
        (0.5, 0.1, "time_s = 0.5, expected ≥ the last arrival's 1.0"),
        (2.0, -0.1, "prefill_s = -0.1, expected a finite number ≥ 0"),
        (2.0, float("nan"), "prefill_s = nan, expected a finite number ≥ 0"),
    ],
)
def test_bad_arrivals_are_refused_and_the_log_is_kept(time_s, prefill_s, message):
    log = ArrivalLog()
    log.add(1.0, 0.5, (4,))
    with pytest.raises(ValueError) as err:
        log.add(time_s, prefill_s, (4,))
    assert str(err.value) == message
    assert log.window(0.0, 5.0) == (1, 0.5) and log.carrying(4, 0.0, 5.0) == 1


def test_horizon_must_be_positive():
    with pytest.raises(ValueError) as err:
        ArrivalLog(horizon_s=0.0)
    assert str(err.value) == "horizon_s = 0.0, expected a number > 0"


def test_counts_stay_right_as_the_oldest_arrivals_are_compacted_away():
    log = ArrivalLog(horizon_s=100.0)
    for i in range(1000):  # one arrival a second, 0.25 s of prefill each, every third one carrying hash 5
        log.add(float(i), 0.25, (5,) if i % 3 == 0 else (6,))
    # kept: the arrivals at 899 … 999 s (those before 999 − 100 = 899 are dropped)
    assert len(log) == 101
    assert log.window(0.0, 1000.0) == (101, 25.25)
    assert log.window(950.0, 960.0) == (10, 2.5)
    assert log.carrying(5, 0.0, 1000.0) == 34  # 900, 903, …, 999
    assert log.carrying(6, 950.0, 960.0) == 7  # 950, 952, 953, 955, 956, 958, 959
