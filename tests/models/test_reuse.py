"""The reuse classifier: recovers a known synthetic relation, training frame from a hand-made history,
save/load and the eviction-spec hash refusal."""

import json

import numpy as np
import pandas as pd
import pytest

from kvcost.features.spec import EVICTION_FEATURE_NAMES, FEATURE_SPEC, feature_spec_hash
from kvcost.models.reuse import (
    EvictionSpecMismatch,
    ReuseClassifier,
    characteristic_time_s,
    eviction_spec_hash,
    idle_periods,
    reuse_training_frame,
)


def synthetic(n: int, seed: int) -> pd.DataFrame:
    """P(reuse) = 0.8 for shallow blocks (depth < 10) idle < 60 s, 0.1 otherwise."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame(0.0, index=range(n), columns=list(EVICTION_FEATURE_NAMES))
    frame["depth_blocks"] = rng.integers(0, 40, n)
    frame["idle_s"] = rng.uniform(0, 600, n)
    frame["age_s"] = frame["idle_s"] + rng.uniform(0, 600, n)
    frame["hits"] = rng.integers(0, 5, n)
    p = np.where((frame["depth_blocks"] < 10) & (frame["idle_s"] < 60), 0.8, 0.1)
    frame["label"] = (rng.uniform(size=n) < p).astype(int)
    frame["p_true"] = p
    return frame


def test_classifier_recovers_a_known_relation_within_0_05():
    model = ReuseClassifier(horizon_s=60.0, num_threads=1).fit(synthetic(8_000, seed=0))
    test = synthetic(2_000, seed=1)
    p = model.predict_features(test[list(EVICTION_FEATURE_NAMES)].to_numpy())
    for value in (0.8, 0.1):
        mean = p[test["p_true"] == value].mean()
        assert abs(mean - value) < 0.05, (value, mean)


def test_same_seed_same_model(tmp_path):
    frame = synthetic(1_000, seed=2)
    x = frame[list(EVICTION_FEATURE_NAMES)].to_numpy()
    a = ReuseClassifier(60.0, num_threads=1).fit(frame).predict_features(x)
    b = ReuseClassifier(60.0, num_threads=1).fit(frame).predict_features(x)
    assert np.array_equal(a, b)


def test_save_load_round_trip_and_spec_hash_refusal(tmp_path):
    frame = synthetic(1_000, seed=3)
    model = ReuseClassifier(60.0, num_threads=1).fit(frame)
    path = model.save(tmp_path / "reuse")
    loaded = ReuseClassifier.load(path)
    x = frame[list(EVICTION_FEATURE_NAMES)].to_numpy()[:50]
    assert loaded.horizon_s == 60.0
    np.testing.assert_allclose(loaded.predict_features(x), model.predict_features(x))
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["eviction_spec_hash"] = "0123456789abcdef"
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(EvictionSpecMismatch) as err:
        ReuseClassifier.load(path)
    assert str(err.value) == (
        f"{path}: reuse model trained with eviction feature spec 0123456789abcdef, this kvcost uses "
        f"{eviction_spec_hash()}; retrain it on a fresh block history (kvcost eviction-study trains one)"
    )


def test_eviction_spec_is_hashed_apart_from_the_routing_spec():
    assert eviction_spec_hash() != feature_spec_hash(FEATURE_SPEC)
    assert len(eviction_spec_hash()) == 16


def test_bad_inputs():
    with pytest.raises(ValueError, match="horizon_s = 0, expected a finite number of seconds > 0"):
        ReuseClassifier(0)
    with pytest.raises(ValueError, match="label has 1 class"):
        ReuseClassifier(1.0).fit(synthetic(100, 0).assign(label=0))
    with pytest.raises(RuntimeError, match="not fitted"):
        ReuseClassifier(1.0).predict_features(np.zeros((1, len(EVICTION_FEATURE_NAMES))))


EVENTS = pd.DataFrame(
    [
        # worker 0, block 7: stored at 0, idle at 1, hit at 5, idle at 6, evicted at 20, stored again at 30
        (0, 0.0, 7, "stored", 0, 2),
        (0, 1.0, 7, "idle", 0, 2),
        (0, 5.0, 7, "hit", 0, 3),
        (0, 6.0, 7, "idle", 0, 3),
        (0, 20.0, 7, "evicted", 0, 0),
        (0, 30.0, 7, "stored", 0, 1),
        (0, 31.0, 7, "idle", 0, 1),
        (1, 2.0, 7, "stored", 1, 2),  # same hash on another worker: its own history
        (1, 3.0, 7, "idle", 1, 2),
    ],
    columns=["worker_id", "t_s", "block_hash", "event", "depth_blocks", "request_blocks"],
)


def test_idle_periods_and_characteristic_time():
    periods = idle_periods(EVENTS)
    assert periods[["worker_id", "idle_t_s", "hits", "created_s", "next_demand_s", "evicted_s"]].values.tolist() == [
        [0, 1.0, 0, 0.0, 5.0, np.inf],
        [0, 6.0, 1, 0.0, 30.0, 20.0],
        [0, 31.0, 0, 30.0, np.inf, np.inf],
        [1, 3.0, 0, 2.0, np.inf, np.inf],
    ]
    assert characteristic_time_s(EVENTS) == 14.0


def test_the_characteristic_time_is_the_mean_where_most_evicted_blocks_never_idled():
    # three blocks evicted the moment they turned idle, one after 6 s: median 0, mean 1.5 s
    rows = [(0, 0.0, h, "stored", 0, 1) for h in range(4)] + [(0, 1.0, h, "idle", 0, 1) for h in range(4)]
    rows += [(0, 1.0, h, "evicted", 0, 0) for h in range(3)] + [(0, 7.0, 3, "evicted", 0, 0)]
    events = pd.DataFrame(rows, columns=EVENTS.columns)
    assert characteristic_time_s(events) == 1.5


def test_training_frame_labels_demand_within_h_and_drops_censored_samples():
    frame = reuse_training_frame(EVENTS, horizon_s=10.0, size_bytes=64.0, seed=0, samples_per_idle=1, end_s=40.0)
    # idle at 1 → demand at 5 (label 1); at 6 → demand at 30 (> 16, label 0); at 31 → none, 41 > end (dropped);
    # worker 1 at 3 → none by 13 ≤ 40 (label 0)
    assert frame[["t_s", "label", "hits", "age_s", "size_bytes", "tail_distance_blocks"]].values.tolist() == [
        [1.0, 1, 0, 1.0, 64.0, 1],
        [6.0, 0, 1, 6.0, 64.0, 2],
        [3.0, 0, 0, 1.0, 64.0, 0],
    ]
    assert frame["mean_reuse_gap_s"].tolist() == [-1.0, 6.0, -1.0]
