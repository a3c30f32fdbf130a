"""Tests for kvcost.features.build (feature_columns, stack_features) on the linear step model (tests/conftest.py)."""

import numpy as np
import pytest

from kvcost.core.links import LinkSpec
from kvcost.core.types import DirectoryMatch, Namespace, ReusePlan, RouteRequest
from kvcost.features.build import KV_WAIT_SD_COLUMN, feature_columns, stack_features
from kvcost.features.nominal import NominalCosts
from kvcost.features.spec import FEATURE_INDEX, FEATURE_NAMES

REQUEST = RouteRequest(
    request_id=7, arrival_s=3.0, input_tokens=1100, block_hashes=(1, 2), namespace=Namespace("linear")
)


@pytest.fixture
def case(linear_step_model, make_snapshot):
    """Worker 0: holds 1 block in CPU, 1000 tokens queued, 2 decoding, KV nearly full; worker 1: idle."""
    busy = make_snapshot(
        0,
        waiting_prefill=((1000, 0),),
        running_requests=2,
        decode_context_tokens=1000,
        kv_usage=0.25,
        idle_cached_blocks=7,
        recent_step_s=0.02,
        step_remaining_s=0.005,
        kv_capacity_blocks=8,
        waiting_prompt_blocks=5,
        oldest_waiting_s=0.7,
        recent_step_nominal_s=0.016,
    )
    idle = make_snapshot(1)
    matches = [DirectoryMatch(0, 1, "cpu", 2.0), DirectoryMatch(1, 0, "none", float("inf"))]
    return [busy, idle], matches, [512, 0], {"linear-gpu": linear_step_model}


def build(snapshots, matches, reusable, models):
    return stack_features(feature_columns(REQUEST, snapshots, matches, reusable, models, NominalCosts()))


def test_shape_and_exact_columns(case):
    x = build(*case)
    assert x.shape == (2, len(FEATURE_NAMES)) == (2, 29)
    assert x.dtype == np.float64
    # busy worker: 588 uncached tokens share one step with the 1000 queued (chunk 8190):
    # 1590 tokens × 1 µs + 1 ms overhead + 1000 decode context × 1 µs
    # + attention (1000 × 1001 / 2 + 588 × (512 + 589 / 2)) pairs × 1e-12 s
    busy_prefill_s = 0.00159 + 0.001 + 0.001 + (500_500 + 474_222) * 1e-12
    # idle worker: 1100 tokens + 1 ms + 1100 × 1101 / 2 pairs
    idle_prefill_s = 0.0011 + 0.001 + 605_550e-12
    expected = {
        "input_tokens": [1100, 1100],
        "request_blocks": [2, 2],
        "reusable_tokens": [512, 0],
        "uncached_tokens": [588, 1100],
        "reusable_tier": [2, 0],
        "directory_age_s": [2.0, -1.0],  # never heard from → -1
        "load_bytes": [0, 0],  # no plan: the prefix counts as GPU-resident
        "disk_load_bytes": [0, 0],
        "transfer_bytes": [0, 0],
        "waiting_requests": [1, 0],
        "running_requests": [2, 0],
        "queued_prefill_tokens": [1000, 0],
        "decode_context_tokens": [1000, 0],
        "kv_usage": [0.25, 0.0],
        "idle_cached_blocks": [7, 0],
        # idle worker: none measured, its nominal 1-token step (1 µs + 1 ms) × the busy one's measured ÷ nominal
        # step (0.02 s ÷ (2 × 1 µs + 1 ms + 1000 context × 1 µs)): 0.001001 × 0.02 / 0.002002
        "recent_step_s": [0.02, 0.01],
        "step_remaining_s": [0.005, 0.0],
        "kv_available_blocks": [6, 0],  # 8 − round(0.25 × 8); unknown capacity → 0
        "kv_deficit_blocks": [1, 0],  # 5 queued + 2 own new (3 prompt blocks, 1 reused) − 6 available
        "oldest_waiting_s": [0.7, 0.0],
        # 1 deficit block, 2 decoders of 1000 / 2 / 512 blocks each: both must finish, after 172 × (1/2 + 1)
        # steps in expectation; 1 of them is the queue's own (1000 tokens, one chunk); the other 257 are
        # decode-only steps of 2 tokens × 1 µs + 1 ms + 1000 context × 1 µs
        "kv_wait_estimate_s": [257 * 0.002002, 0.0],
        "recent_step_ratio": [1.25, 1.0],  # 0.02 / 0.016; unknown nominal → 1
        "load_backlog_s": [0.0, 0.0],
        "transfer_backlog_s": [0.0, 0.0],
        "nominal_queue_s": [0.005, 0.0],
        "nominal_lookup_s": [2.2e-4, 2.2e-4],
        "nominal_transfer_s": [0.0, 0.0],
        "nominal_prefill_s": [busy_prefill_s, idle_prefill_s],
        "nominal_first_token_s": [2e-3, 2e-3],
    }
    assert list(expected) == list(FEATURE_NAMES)
    for name, column in expected.items():
        assert x[:, FEATURE_INDEX[name]].tolist() == pytest.approx(column), name


def test_plans_price_tier_loads_and_transfers(linear_step_model, make_snapshot):
    """Worker 0 loads 1 CPU + 1 disk block; worker 1 fetches 2 blocks over a busy network link."""
    request = RouteRequest(0, 0.0, 1100, (1, 2), Namespace("linear"))
    costs = NominalCosts(cpu_to_gpu=LinkSpec(1e9, 0.001), disk_to_cpu=LinkSpec(1e8, 0.002), network=LinkSpec(1e9, 0.01))
    plans = [
        ReusePlan("local", gpu_blocks=0, cpu_blocks=1, disk_blocks=1),
        ReusePlan("fetch", gpu_blocks=0, fetch_blocks=2, source_id=0, conversion_factor=0.5),
    ]
    snapshots = [make_snapshot(0, load_backlog_s=0.25), make_snapshot(1, transfer_backlog_s=0.5)]
    matches = [DirectoryMatch(0, 2, "disk", 0.0), DirectoryMatch(1, 0, "none", 0.0)]
    x = stack_features(
        feature_columns(request, snapshots, matches, [1024, 1024], {"linear-gpu": linear_step_model}, costs, plans)
    )
    block_bytes = linear_step_model.model.kv_bytes_per_token * 512

    def column(name):
        return x[:, FEATURE_INDEX[name]].tolist()

    assert column("load_bytes") == [2 * block_bytes, 2 * block_bytes]
    assert column("disk_load_bytes") == [block_bytes, 0]
    assert column("transfer_bytes") == [0, 2 * block_bytes]
    assert column("reusable_tier") == [3, 4]  # disk; fetched from elsewhere = remote
    lookup_s = 2.2e-4 + 0.25 + (0.002 + block_bytes / 1e8) + (0.001 + 2 * block_bytes / 1e9)
    fetched_load_s = 2.2e-4 + 0.001 + 2 * block_bytes / 1e9  # no backlog on worker 1's PCIe link
    assert column("nominal_lookup_s") == pytest.approx([lookup_s, fetched_load_s])
    network_s = 0.01 + 2 * block_bytes / 1e9
    assert column("nominal_transfer_s") == pytest.approx([0.0, 0.5 + 1.5 * network_s])  # backlog + ×1.5 conversion


def test_tier_is_zero_without_reusable_tokens(linear_step_model, make_snapshot):
    # the directory reports a GPU block, but a 1-token prompt reuses nothing
    request = RouteRequest(0, 0.0, 1, (5,), Namespace("linear"))
    x = stack_features(
        feature_columns(
            request,
            [make_snapshot(0)],
            [DirectoryMatch(0, 1, "gpu", 0.0)],
            [0],
            {"linear-gpu": linear_step_model},
            NominalCosts(),
        )
    )
    assert x[0, FEATURE_INDEX["reusable_tier"]] == 0.0


def test_no_leakage_same_inputs_same_rows(case):
    snapshots, matches, reusable, models = case
    before = (list(snapshots), list(matches), list(reusable))
    first, second = build(*case), build(*case)
    assert np.array_equal(first, second)
    assert first is not second
    assert (snapshots, matches, reusable) == before
    # a row depends only on its own candidate: reversing the candidates reverses the rows
    reversed_x = build(snapshots[::-1], matches[::-1], reusable[::-1], models)
    assert np.array_equal(reversed_x, first[::-1])


def test_unknown_gpu_type_raises(case, make_snapshot):
    _, matches, reusable, models = case
    with pytest.raises(KeyError, match="h100"):
        build([make_snapshot(0, gpu="h100"), make_snapshot(1)], matches, reusable, models)


def test_mismatched_lengths_raise(case):
    snapshots, matches, _, models = case
    with pytest.raises(ValueError):
        build(snapshots, matches, [512], models)


def test_feature_columns_are_named_arrays_over_candidates_that_stack_into_the_matrix(case):
    snapshots, matches, reusable, models = case
    columns = feature_columns(REQUEST, snapshots, matches, reusable, models, NominalCosts())
    assert list(columns) == [*FEATURE_NAMES, KV_WAIT_SD_COLUMN]  # every feature of the one schema, in its order
    assert all(column.shape == (2,) for column in columns.values())
    assert columns["request_blocks"].tolist() == [2, 2]
    assert columns["kv_available_blocks"].tolist() == [6.0, 0.0]  # 8 − round(0.25 × 8); the idle worker has 0
    assert columns["kv_deficit_blocks"].tolist() == [1.0, 0.0]  # 5 queued + 2 own − 6 available; no capacity: 0
    assert columns["recent_step_ratio"].tolist() == [1.25, 1.0]  # 0.02 / 0.016; no nominal: 1
    x = build(*case)
    assert all(np.array_equal(x[:, FEATURE_INDEX[name]], columns[name]) for name in FEATURE_NAMES)
    assert columns[KV_WAIT_SD_COLUMN].shape == (2,)  # not a feature: the matrix leaves it out


def test_directory_age_only_where_the_worker_holds_part_of_the_prefix(case):
    snapshots, _, _, models = case
    heard = [DirectoryMatch(0, 1, "cpu", 2.0), DirectoryMatch(1, 0, "none", 5.0)]  # 1 was heard from, holds none
    x = build(snapshots, heard, [512, 0], models)
    assert x[:, FEATURE_INDEX["directory_age_s"]].tolist() == [2.0, -1.0]
