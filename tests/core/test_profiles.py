"""Tests for kvcost.core.profiles (bundled Vidur operator profiles)."""

import csv
import statistics
from importlib import resources

import numpy as np
import pandas as pd
import pytest

from kvcost.core.profiles import (
    BUNDLED_COLUMNS,
    BUNDLED_VIDUR_FILES,
    PER_LAYER_OP_COUNTS,
    OperatorProfile,
    available_vidur_profiles,
    load_vidur_profile,
    load_vidur_send_recv,
    profile_from_frame,
    reduce_vidur_csv,
)

VIDUR_ROOT = resources.files("kvcost.data") / "bundled" / "profiles" / "vidur"


def _row(num_tokens, tp, ms):
    row = {
        "num_tokens": num_tokens,
        "num_tensor_parallel_workers": tp,
        "n_head": 32,
        "n_kv_head": 8,
        "n_embd": 4096,
        "n_expanded_embd": 14336,
        "vocab_size": 128256,
    }
    for col in BUNDLED_COLUMNS:
        if col.startswith("time_stats."):
            row[col] = ms
            row[col.replace(".median", ".mean")] = ms + 1.0
    return row


def test_bundled_files_and_licence_exist():
    assert available_vidur_profiles() == [
        ("a100", "Llama-2-7b-hf"),
        ("a100", "Meta-Llama-3-8B"),
        ("h100", "Llama-2-70b-hf"),
        ("h100", "Llama-2-7b-hf"),
    ]
    assert (VIDUR_ROOT / "LICENSE-SOURCE.txt").read_text().count("MIT License") == 1
    notice = (resources.files("kvcost.data") / "bundled" / "NOTICE-profiles.md").read_text()
    assert "7d47513363ec447a741ac5e47241580b47724fbf" in notice


@pytest.mark.parametrize("rel", BUNDLED_VIDUR_FILES)
def test_bundled_files_are_reduced(rel):
    with (VIDUR_ROOT.joinpath(*rel.split("/"))).open() as handle:
        frame = pd.read_csv(handle)
    assert tuple(frame.columns) == BUNDLED_COLUMNS
    assert set(frame["num_tensor_parallel_workers"]) == {1, 2, 4, 8}


def test_load_matches_hand_computation_from_csv():
    rel = "compute/a100/meta-llama/Meta-Llama-3-8B/mlp.csv"
    with VIDUR_ROOT.joinpath(*rel.split("/")).open() as handle:
        rows = [
            r for r in csv.DictReader(handle) if r["num_tokens"] == "512" and r["num_tensor_parallel_workers"] == "1"
        ]
    per_op = {
        op: statistics.median(float(r[f"time_stats.{op}.median"]) for r in rows) for op in ("emb", *PER_LAYER_OP_COUNTS)
    }
    expected_layer_s = 1e-3 * (sum(per_op[op] for op in PER_LAYER_OP_COUNTS) + per_op["add"])
    profile = load_vidur_profile("a100", "Meta-Llama-3-8B")
    i = int(np.searchsorted(profile.num_tokens, 512))
    assert profile.num_tokens[i] == 512
    assert profile.per_layer_s[i] == pytest.approx(expected_layer_s, rel=1e-12)
    assert profile.once_s[i] == pytest.approx(1e-3 * per_op["emb"], rel=1e-12)
    assert profile.source == "vidur/" + rel


@pytest.mark.parametrize(
    "gpu, model", [("a100", "Meta-Llama-3-8B"), ("a100", "Llama-2-7b-hf"), ("h100", "Llama-2-7b-hf")]
)
def test_loaded_profiles_are_well_formed(gpu, model):
    p = load_vidur_profile(gpu, model)
    assert p.num_tokens.dtype == np.int64 and p.per_layer_s.dtype == np.float64
    assert np.all(np.diff(p.num_tokens) > 0) and p.num_tokens[0] == 1
    assert np.all(p.per_layer_s > 0) and np.all(p.once_s > 0)
    # a 4096-token layer of a 7-8 B model takes milliseconds, not µs or seconds
    i = int(np.searchsorted(p.num_tokens, 4096))
    assert 1e-3 < p.per_layer_s[i] < 0.05


def test_unknown_profile_lists_available():
    with pytest.raises(KeyError, match="h100/Llama-2-7b-hf"):
        load_vidur_profile("h100", "Meta-Llama-3-8B")
    with pytest.raises(KeyError, match="gpu 'v100'"):
        load_vidur_profile("v100", "Llama-2-7b-hf")


def test_reduce_vidur_csv_keeps_every_degree_and_the_bundled_columns(tmp_path):
    src, dst = tmp_path / "src.csv", tmp_path / "out" / "mlp.csv"
    pd.DataFrame([_row(1, 1, 0.5), _row(1, 2, 0.25), _row(8, 1, 0.75)]).to_csv(src, index=False)
    reduce_vidur_csv(src, dst)
    out = pd.read_csv(dst)
    assert tuple(out.columns) == BUNDLED_COLUMNS
    assert out["num_tokens"].tolist() == [1, 1, 8]
    assert out["time_stats.emb.median"].tolist() == [0.5, 0.25, 0.75]


def test_a_tensor_parallel_shard_loads_by_degree_and_an_absent_degree_is_named():
    tp1 = load_vidur_profile("h100", "Llama-2-70b-hf")
    tp4 = load_vidur_profile("h100", "Llama-2-70b-hf", tp=4)
    assert tp4.source == "vidur/compute/h100/meta-llama/Llama-2-70b-hf/mlp.csv (tp 4)"
    i = int(np.searchsorted(tp1.num_tokens, 4096))
    # a quarter of the GEMMs: between 3× and 4× faster at 4,096 tokens
    assert 3.0 < tp1.per_layer_s[i] / tp4.per_layer_s[i] < 4.0
    with pytest.raises(KeyError, match=r"degrees \[1, 2, 4, 8\], not 3"):
        load_vidur_profile("h100", "Llama-2-70b-hf", tp=3)


def test_profile_from_frame_refuses_mixed_degrees():
    frame = pd.DataFrame([_row(1, 1, 0.5), _row(1, 2, 0.25)])
    with pytest.raises(ValueError, match="mixes tensor-parallel degrees"):
        profile_from_frame(frame, source="x")


def test_send_recv_profile_medians_in_seconds():
    frame = load_vidur_send_recv("a100_dgx")
    assert frame.columns.tolist() == ["size", "devices_per_node", "time_s"]
    last = frame[(frame["size"] == 67108864) & (frame["devices_per_node"] == 2)]
    assert last["time_s"].tolist() == pytest.approx([0.294e-3])


def test_profile_from_frame_takes_median_of_repeats_and_counts_add_twice():
    frame = pd.DataFrame([_row(8, 1, 1.0), _row(8, 1, 2.0), _row(8, 1, 6.0), _row(1, 1, 1.0)])
    p = profile_from_frame(frame, source="test")
    assert p.num_tokens.tolist() == [1, 8]
    # 9 per-layer ops, add twice → 10 op-times of 1 ms (1 token) and 2 ms (8 tokens, median)
    assert p.per_layer_s.tolist() == pytest.approx([10e-3, 20e-3])
    assert p.once_s.tolist() == pytest.approx([1e-3, 2e-3])


def test_profile_from_frame_missing_column():
    frame = pd.DataFrame([_row(1, 1, 1.0)]).drop(columns=["time_stats.add.median"])
    with pytest.raises(ValueError, match="time_stats.add.median"):
        profile_from_frame(frame, source="x")


def test_operator_profile_validates_and_is_read_only():
    p = OperatorProfile(num_tokens=[1, 8], per_layer_s=[1.0, 2.0], once_s=[0.0, 0.0], source="t")
    with pytest.raises(ValueError):
        p.per_layer_s[0] = 5.0
    with pytest.raises(ValueError, match="strictly increasing"):
        OperatorProfile(num_tokens=[8, 1], per_layer_s=[1.0, 2.0], once_s=[0, 0], source="t")
    with pytest.raises(ValueError, match=">= 2 points"):
        OperatorProfile(num_tokens=[1], per_layer_s=[1.0], once_s=[0], source="t")
    with pytest.raises(ValueError, match="must match"):
        OperatorProfile(num_tokens=[1, 2], per_layer_s=[1.0], once_s=[0, 0], source="t")
