"""Chain-level eviction features (the reused prefix of the last request) and the study's restricted classifier."""

import numpy as np
import pandas as pd
import pytest

from kvcost.eviction import BlockCostTable, EvictionContext
from kvcost.eviction.index import make_eviction_index
from kvcost.features.eviction import eviction_feature_matrix
from kvcost.features.spec import EVICTION_FEATURE_NAMES
from kvcost.models.reuse import STUDY_FEATURES, STUDY_PARAMS, ReuseClassifier, idle_periods, reuse_training_frame
from kvcost.replay.kv_cache import BlockPool

COL = {name: i for i, name in enumerate(EVICTION_FEATURE_NAMES)}


def test_reused_share_is_reused_over_request_blocks_clipped():
    x = eviction_feature_matrix(
        depth_blocks=np.array([0, 3, 1]),
        hits=np.array([0, 2, 0]),
        idle_s=np.array([1.0, 2.0, 0.0]),
        age_s=np.array([1.0, 10.0, 0.0]),
        size_bytes=np.float64(64.0),
        category=np.float64(0),
        request_blocks=np.array([4, 4, 2]),
        request_reused_blocks=np.array([3, 0, 5]),
    )
    assert x[:, COL["request_reused_blocks"]].tolist() == [3.0, 0.0, 5.0]
    assert x[:, COL["request_reused_share"]].tolist() == [0.75, 0.0, 1.0]
    assert x[:, COL["mean_reuse_gap_s"]].tolist() == [-1.0, 4.0, -1.0]


def test_pool_passes_the_requests_reused_prefix_to_the_index_and_the_log():
    costs = BlockCostTable(np.array([0.1, 0.2, 0.3]), np.array([1.0, 2.0, 3.0]), size_bytes=1.0)
    index = make_eviction_index("cost_aware", EvictionContext(), costs, 8)
    pool = BlockPool(8, eviction=index, record_events=True)
    for hashes, t_s in (([1, 2], 0.0), ([1, 2, 3], 2.0)):
        allocation, _ = pool.try_allocate(hashes, len(hashes), t_s)
        pool.register_prefill(allocation, hashes, t_s)
        pool.free(allocation, t_s + 1.0)
    slots = np.array([index._slot[h] for h in (1, 2, 3)])
    assert index.table(slots).request_reused_blocks.tolist() == [2, 2, 2]  # the second request found 2 cached
    idle = [e for e in pool.block_events if e[2] == "idle"]
    assert [(e[0], e[1], e[4], e[5]) for e in idle] == [
        (1.0, 2, 2, 0),
        (1.0, 1, 2, 0),
        (3.0, 3, 3, 2),
        (3.0, 2, 3, 2),
        (3.0, 1, 3, 2),
    ]


def test_idle_periods_carry_reused_blocks_and_old_logs_read_as_zero():
    events = pd.DataFrame(
        [(0, 0.0, 7, "stored", 0, 2, 0), (0, 1.0, 7, "idle", 0, 2, 1)],
        columns=["worker_id", "t_s", "block_hash", "event", "depth_blocks", "request_blocks", "reused_blocks"],
    )
    assert idle_periods(events)["reused_blocks"].tolist() == [1]
    assert idle_periods(events.drop(columns="reused_blocks"))["reused_blocks"].tolist() == [0]
    frame = reuse_training_frame(events, horizon_s=1.0, size_bytes=8.0, seed=0, samples_per_idle=1, end_s=5.0)
    assert frame[["request_reused_blocks", "request_reused_share", "label"]].values.tolist() == [[1.0, 0.5, 0.0]]


def synthetic(n: int, seed: int) -> pd.DataFrame:
    """P(reuse) = 0.6 when the last request reused part of its prefix, else 0.2; depth is noise."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame(0.0, index=range(n), columns=list(EVICTION_FEATURE_NAMES))
    frame["depth_blocks"] = rng.integers(0, 40, n)
    frame["request_blocks"] = 40
    frame["request_reused_blocks"] = rng.choice([0, 20], n)
    frame["request_reused_share"] = frame["request_reused_blocks"] / 40
    frame["idle_s"] = rng.uniform(0, 100, n)
    p = np.where(frame["request_reused_blocks"] > 0, 0.6, 0.2)
    frame["label"] = (rng.uniform(size=n) < p).astype(int)
    return frame


def test_study_classifier_uses_only_its_features(tmp_path):
    frame = synthetic(6_000, seed=0)
    model = ReuseClassifier(60.0, STUDY_FEATURES, **STUDY_PARAMS).fit(frame)
    x = frame[list(EVICTION_FEATURE_NAMES)].to_numpy()[:200]
    shuffled = x.copy()
    shuffled[:, COL["depth_blocks"]] = 999.0  # not a feature of the model: predictions unchanged
    np.testing.assert_array_equal(model.predict_features(x), model.predict_features(shuffled))
    p = model.predict_features(x)
    reused = x[:, COL["request_reused_blocks"]] > 0
    assert abs(p[reused].mean() - 0.6) < 0.05 and abs(p[~reused].mean() - 0.2) < 0.05
    loaded = ReuseClassifier.load(model.save(tmp_path / "m"))
    assert loaded.features == STUDY_FEATURES
    np.testing.assert_array_equal(loaded.predict_features(x), p)


def test_feature_subset_errors():
    with pytest.raises(ValueError, match=r"features \['nope'\] invalid"):
        ReuseClassifier(1.0, ("nope",))
    with pytest.raises(ValueError, match=r"monotone names \['idle_s'\] that are not among features \['hits'\]"):
        ReuseClassifier(1.0, ("hits",))
