"""Tests for kvcost.core.roofline (the roofline, the all-reduce, and the fits behind their constants)."""

import numpy as np
import pytest

from kvcost.core.roofline import (
    FITTED_LINKS,
    FITTED_ROOFLINES,
    RooflineFit,
    allreduce_s,
    block_weight_bytes,
    fit_link,
    fit_roofline,
    fitted_gpu,
    roofline_s,
)
from kvcost.core.specs import GPUS, GpuSpec, model_from_config

SMALL = model_from_config(
    {"num_hidden_layers": 2, "hidden_size": 8, "num_attention_heads": 2, "intermediate_size": 16, "vocab_size": 10},
    "small",
)
GPU = GpuSpec("unit", memory_bytes=10**9, peak_dense_bf16_flops=1e6, hbm_bytes_per_s=1e6, interconnect_bytes_per_s=2e6)
FIT = RooflineFit(mfu=0.5, hbm_efficiency=0.5, layer_launch_s=1e-3)


def test_roofline_by_hand():
    # 2 layers × (4 × 64 attention + 384 MLP) = 1280 params → 2560 FLOPs a token; weights 1312 params × 2 B
    assert SMALL.matmul_flops_per_token == 2560
    assert block_weight_bytes(SMALL, 1.0).tolist() == 2 * 656 * 2
    # 1 token: max(2560 / 5e5, 2624 / 5e5) + 2 ms; 100 tokens: compute-bound, 256000 / 5e5
    got = roofline_s(SMALL, GPU, np.array([1.0, 100.0]), fit=FIT)
    assert got.tolist() == pytest.approx([2624 / 5e5 + 2e-3, 256000 / 5e5 + 2e-3])
    # tensor-parallel 2: half the FLOPs and half the bytes per GPU
    assert roofline_s(SMALL, GPU, 100.0, tp=2, fit=FIT) == pytest.approx(128000 / 5e5 + 2e-3)


def test_an_expert_mixture_reads_only_the_experts_its_tokens_touch():
    moe = model_from_config(
        {
            "num_hidden_layers": 1,
            "hidden_size": 8,
            "num_attention_heads": 2,
            "num_experts": 4,
            "num_experts_per_tok": 1,
            "moe_intermediate_size": 2,
        },
        "moe",
    )
    expert, dense = 3 * 8 * 2, 4 * 64 + 8 * 4  # attention + router
    # 1 token touches 1 expert; 2 tokens 4 × (1 − (3/4)²) = 1.75 in expectation; many tokens all 4
    assert block_weight_bytes(moe, np.array([1.0, 2.0, 1e6])).tolist() == pytest.approx(
        [2 * (dense + expert), 2 * (dense + 1.75 * expert), 2 * (dense + 4 * expert)]
    )


def test_ring_allreduce_by_hand():
    h100 = GPUS.get("h100")
    link = FITTED_LINKS["h100"]
    # 4 GPUs: 2 × 3/4 of 1 MB over one direction (half of 900 GB/s, times the efficiency)
    expected = link.latency_s + 1.5e6 / (link.efficiency * 450e9)
    assert allreduce_s(1e6, 4, h100) == pytest.approx(expected)
    assert allreduce_s(1e6, 1, h100) == 0.0
    with pytest.raises(ValueError, match="gpu 'unit' has no interconnect_bytes_per_s"):
        allreduce_s(1e6, 2, GpuSpec("unit", 1, 1.0, 1.0, profile_of="a100"))


def test_a_gpu_without_profiles_borrows_its_architectures_fit_and_an_unknown_one_is_named():
    assert fitted_gpu(GPUS.get("h200")) == "h100" and fitted_gpu(GPUS.get("a100-40gb")) == "a100"
    with pytest.raises(KeyError, match="gpu 'unit' has no fitted roofline"):
        fitted_gpu(GPU)


@pytest.mark.parametrize("gpu", sorted(FITTED_ROOFLINES))
def test_the_pinned_efficiencies_are_what_the_bundled_profiles_fit(gpu):
    fit, errors = fit_roofline(gpu)
    pinned = FITTED_ROOFLINES[gpu]
    assert fit.mfu == pytest.approx(pinned.mfu, rel=1e-3)
    assert fit.hbm_efficiency == pytest.approx(pinned.hbm_efficiency, rel=1e-3)
    assert fit.layer_launch_s == pytest.approx(pinned.layer_launch_s, rel=1e-3)
    assert np.median(errors) < 0.08  # the docstring's table: 5.2 % (a100), 7.6 % (h100)
    link = fit_link(gpu)
    assert (link.latency_s, link.efficiency) == pytest.approx(
        (FITTED_LINKS[gpu].latency_s, FITTED_LINKS[gpu].efficiency), rel=1e-3
    )
