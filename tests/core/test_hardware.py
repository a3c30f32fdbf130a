"""Tests for kvcost.core.hardware (specs, registries, StepTimeModel)."""

import numpy as np
import pytest

from kvcost.core.hardware import (
    GIB_BYTES,
    GPUS,
    MODELS,
    GpuSpec,
    ModelSpec,
    StepTimeModel,
    derived_profile,
    profile_for,
)
from kvcost.core.profiles import OperatorProfile, load_vidur_profile
from kvcost.core.roofline import allreduce_s, roofline_s

TINY_MODEL = ModelSpec(
    name="tiny",
    num_layers=2,
    num_q_heads=4,
    num_kv_heads=2,
    head_dim=8,
    hidden_size=32,
    num_params=1000,
    dtype_bytes=2,
    profile_dir="none",
)
TINY_GPU = GpuSpec(
    name="tiny-gpu", memory_bytes=1_000_000, peak_dense_bf16_flops=1e9, hbm_bytes_per_s=1e6, profile_of="a100"
)
# step totals (2 layers × per_layer + once): [2.1e-3, 4.2e-3, 8.3e-3] s at [1, 8, 16] tokens
TINY_PROFILE = OperatorProfile(
    num_tokens=[1, 8, 16], per_layer_s=[1e-3, 2e-3, 4e-3], once_s=[1e-4, 2e-4, 3e-4], source="hand-made"
)


def tiny(**settings):
    defaults = dict(
        token_budget=16, attention_flops_efficiency=0.5, decode_bandwidth_efficiency=0.5, step_overhead_s=1e-3
    )
    return StepTimeModel(TINY_MODEL, TINY_GPU, TINY_PROFILE, **(defaults | settings))


def test_registries():
    assert MODELS.names() == [
        "llama-2-70b",
        "llama-2-7b",
        "llama-3-70b",
        "llama-3-8b",
        "llama-3.1-405b",
        "llama-3.1-70b",
        "llama-3.1-8b",
        "mistral-7b",
        "qwen2.5-32b",
        "qwen2.5-72b",
        "qwen2.5-7b",
        "qwen3-30b-a3b",
    ]
    assert GPUS.names() == ["a100", "a100-40gb", "b200", "h100", "h100-pcie", "h200", "l40s", "mi300x"]
    assert MODELS.get("llama-3-8b").profile_dir == "Meta-Llama-3-8B"
    with pytest.raises(KeyError, match="a100, a100-40gb"):
        GPUS.get("v100")


def test_kv_bytes_per_token_and_weights():
    assert MODELS.get("llama-3-8b").kv_bytes_per_token == 131072  # 128 KiB, docs/architecture.md §7
    assert MODELS.get("llama-2-7b").kv_bytes_per_token == 524288
    assert TINY_MODEL.kv_bytes_per_token == 2 * 2 * 2 * 8 * 2
    assert MODELS.get("llama-3-8b").weight_bytes == 2 * 8_030_261_248  # meta-llama/Meta-Llama-3-8B: 8.03 B


def test_nonattention_interpolation_extrapolation_and_zero():
    m = tiny()
    assert m.nonattention_s(0) == 0.0
    assert m.nonattention_s(1) == pytest.approx(2.1e-3)
    assert m.nonattention_s(4) == pytest.approx(2.1e-3 + 3 / 7 * 2.1e-3)
    assert m.nonattention_s(12) == pytest.approx(4.2e-3 + 0.5 * 4.1e-3)
    assert m.nonattention_s(16) == pytest.approx(8.3e-3)
    # beyond the last point: the roofline, scaled to meet the last measured point
    roof = roofline_s(TINY_MODEL, TINY_GPU, np.array([24.0, 16.0]))
    assert m.nonattention_s(24) == pytest.approx(8.3e-3 * roof[0] / roof[1])


def test_table_and_fallback_agree():
    small, big = tiny(token_budget=16), tiny(token_budget=40)
    for n in (0, 3, 16, 17, 24, 40):
        assert small.nonattention_s(n) == pytest.approx(big.nonattention_s(n))
    with pytest.raises(ValueError, match="num_tokens = -1"):
        small.nonattention_s(-1)


def test_prefill_attention_flops_by_hand():
    # 4 × layers 2 × q_heads 4 × head_dim 8 = 256; 3 new after 5 cached: 3 × (5 + 2) = 21 pairs
    assert tiny().prefill_attention_flops(3, 5) == 256 * 21
    assert tiny().prefill_attention_flops(0, 100) == 0.0


def test_attention_and_step():
    m = tiny()
    # 5376 FLOPs at 1e9 × 0.5; 10 context tokens × 128 B at 1e6 × 0.5 B/s
    assert m.attention_s(5376, 10) == pytest.approx(5376 / 5e8 + 1280 / 5e5)
    assert m.step_s(4, 5376, 10) == pytest.approx(3.0e-3 + 5376 / 5e8 + 1280 / 5e5 + 1e-3)


def test_prefill_alone_two_chunks():
    m = tiny()  # budget 16 → chunks of 16 (context 0) and 4 (context 16)
    first = 8.3e-3 + 256 * 16 * 8.5 / 5e8 + 1e-3
    second = 3.0e-3 + 256 * 4 * (16 + 2.5) / 5e8 + 1e-3
    assert m.prefill_alone_s(20) == pytest.approx(first + second)
    assert m.prefill_alone_s(0) == 0.0
    # a cached prefix only adds context
    assert m.prefill_alone_s(4, context_tokens=16) == pytest.approx(second)


def test_kv_capacity_by_hand():
    m = tiny()
    # 1e6 × 0.9 − 2000 weights − 1000 reserve = 897000 B / 128 B per token
    assert m.kv_capacity_tokens(0.9, activation_reserve_bytes=1000) == 7007
    assert m.kv_capacity_blocks(16, 0.9, activation_reserve_bytes=1000) == 437
    with pytest.raises(ValueError, match="^model = 'tiny' leaves no KV capacity on .* memory_bytes=1000000"):
        m.kv_capacity_tokens(0.001, activation_reserve_bytes=0)
    with pytest.raises(ValueError, match="gpu_memory_utilization = 0: expected"):
        m.kv_capacity_tokens(0)
    with pytest.raises(ValueError, match="block_size_tokens = 0"):
        m.kv_capacity_blocks(0)


def test_kv_capacity_llama_3_8b_a100():
    m = StepTimeModel(MODELS.get("llama-3-8b"), GPUS.get("a100"), TINY_PROFILE)
    free = 80 * GIB_BYTES * 0.9 - 8_030_261_248 * 2 - 2 * GIB_BYTES
    assert m.kv_capacity_tokens() == int(free // 131072) == 450907
    assert m.kv_capacity_blocks(512) == 450907 // 512


@pytest.mark.parametrize(
    "field, value, expectation",
    [
        ("token_budget", 0, "an integer >= 1"),
        ("attention_flops_efficiency", 1.5, r"a value in \(0, 1\]"),
        ("decode_bandwidth_efficiency", 0.0, r"a value in \(0, 1\]"),
        ("step_overhead_s", -0.001, "a value >= 0"),
    ],
)
def test_validation_messages(field, value, expectation):
    with pytest.raises(ValueError, match=f"{field} = {value!r}: expected {expectation}"):
        tiny(**{field: value})


def test_derived_profile_ratio_by_hand():
    ref_base = OperatorProfile(num_tokens=[1, 8], per_layer_s=[2e-3, 4e-3], once_s=[1e-4, 1e-4], source="ref-a100")
    ref_target = OperatorProfile(num_tokens=[1, 8], per_layer_s=[1e-3, 1e-3], once_s=[5e-5, 2.5e-5], source="ref-h100")
    out = derived_profile(TINY_PROFILE, ref_base, ref_target)
    assert out.num_tokens.tolist() == [1, 8, 16]
    # ratios 0.5 at 1, 0.25 at 8, and beyond the reference's last point the ratio at 8
    assert out.per_layer_s.tolist() == pytest.approx([0.5e-3, 0.5e-3, 1e-3])
    assert out.once_s.tolist() == pytest.approx([0.5e-4, 0.5e-4, 0.75e-4])
    assert "ref-h100" in out.source and "hand-made" in out.source


def test_derived_h100_llama3_uses_llama2_ratio():
    derived = profile_for(MODELS.get("llama-3-8b"), GPUS.get("h100"))
    base = load_vidur_profile("a100", "Meta-Llama-3-8B")
    l2_a100 = load_vidur_profile("a100", "Llama-2-7b-hf")
    l2_h100 = load_vidur_profile("h100", "Llama-2-7b-hf")
    i = int(np.searchsorted(base.num_tokens, 2048))
    assert base.num_tokens[i] == 2048
    j = int(np.searchsorted(l2_a100.num_tokens, 2048))
    ratio = l2_h100.per_layer_s[j] / l2_a100.per_layer_s[j]
    assert derived.per_layer_s[i] == pytest.approx(base.per_layer_s[i] * ratio)
    k = int(np.searchsorted(base.num_tokens, 16384))
    last_ratio = l2_h100.per_layer_s[-1] / l2_a100.per_layer_s[-1]
    assert derived.per_layer_s[k] == pytest.approx(base.per_layer_s[k] * last_ratio)


def test_a_gpu_measured_on_nothing_takes_its_stand_ins_profile_scaled_by_the_rooflines():
    model, h100, h200 = MODELS.get("llama-3-8b"), GPUS.get("h100"), GPUS.get("h200")
    reference, scaled = profile_for(model, h100), profile_for(model, h200)
    i = int(np.searchsorted(reference.num_tokens, 2048))
    ratio = roofline_s(model, h200, 2048.0) / roofline_s(model, h100, 2048.0)
    assert scaled.per_layer_s[i] == pytest.approx(reference.per_layer_s[i] * ratio)
    assert scaled.source.endswith("× roofline h200 / h100")
    # the H200 has the H100's compute and more bandwidth: never slower, at any step size or TP degree
    for tp in (1, 2, 4, 8):
        a, b = (StepTimeModel(MODELS.get("llama-2-70b"), g, profile_for(MODELS.get("llama-2-70b"), g, tp), tp=tp)
                for g in (h100, h200))  # fmt: skip
        for tokens in (1, 16, 512, 4096, 8192):
            assert b.nonattention_s(tokens) <= a.nonattention_s(tokens)
    assert profile_for(MODELS.get("llama-3-8b"), GPUS.get("a100-40gb")).source.endswith("× roofline a100-40gb / a100")


def test_real_profiles_are_sane():
    a100 = StepTimeModel.for_hardware("llama-3-8b", "a100")
    h100 = StepTimeModel.for_hardware("llama-3-8b", "h100")
    # 2 × 8e9 × 8192 FLOPs ≈ 1.3e14 → 0.42 s at A100 peak; measured must be above, not absurd
    assert 0.42 < a100.nonattention_s(8192) < 1.0
    assert h100.nonattention_s(8192) < a100.nonattention_s(8192) / 2
    # one-token step is weight-read bound: ~16 GB at ~2 TB/s ≈ 8 ms
    assert 0.005 < a100.nonattention_s(1) < 0.02
    assert a100.prefill_alone_s(12000) > a100.prefill_alone_s(8192)
    with pytest.raises(ValueError, match="model = 'gpt-5', expected one of llama-2-70b"):
        StepTimeModel.for_hardware("gpt-5", "a100")


def test_llama_2_7b_past_its_last_measured_point_keeps_growing():
    # kvcost issue 16: the last two points' slope made an 8k step cheaper than a 4k one
    for gpu in ("a100", "h100"):
        m = StepTimeModel.for_hardware("llama-2-7b", gpu)
        assert m.nonattention_s(8192) > 1.8 * m.nonattention_s(4096)
        assert m.prefill_alone_s(8192) > m.prefill_alone_s(4096)


def test_a_tensor_parallel_step_is_one_shard_plus_two_allreduces_per_layer():
    model, h100 = MODELS.get("llama-2-70b"), GPUS.get("h100")
    m = StepTimeModel.for_hardware("llama-2-70b", "h100", tp=4)
    shard = load_vidur_profile("h100", "Llama-2-70b-hf", tp=4)
    i = int(np.searchsorted(shard.num_tokens, 512))
    assert shard.num_tokens[i] == 512
    expected = shard.total_s(80)[i] + 2 * 80 * allreduce_s(512 * 8192 * 2, 4, h100)
    assert m.nonattention_s(512) == pytest.approx(expected)
    # 8 KV heads over 4 GPUs: 2 each; over 16, one replicated head each
    assert m.kv_bytes_per_token_per_gpu == 2 * 80 * 2 * 128 * 2
    assert StepTimeModel(model, h100, None, tp=16).kv_bytes_per_token_per_gpu == 2 * 80 * 1 * 128 * 2
    # each GPU holds a quarter of the weights
    free = 80 * GIB_BYTES * 0.9 - model.weight_bytes / 4 - 2 * GIB_BYTES
    assert m.kv_capacity_tokens() == int(free // m.kv_bytes_per_token_per_gpu)
    with pytest.raises(ValueError, match="^tensor_parallel = 3: expected an integer >= 1 dividing the 64 attention"):
        StepTimeModel(model, h100, None, tp=3)


def test_a_model_without_profiles_is_priced_by_the_roofline():
    m = StepTimeModel.for_hardware("qwen2.5-7b", "h200")
    assert m.profile is None
    expected = roofline_s(MODELS.get("qwen2.5-7b"), GPUS.get("h200"), np.array([1.0, 4096.0]))
    assert [m.nonattention_s(1), m.nonattention_s(4096)] == pytest.approx(expected.tolist())
