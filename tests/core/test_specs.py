"""Tests for kvcost.core.specs (models from config.json, the GPU table)."""

import json

import pytest

from kvcost.core.specs import GIB_BYTES, GPUS, MODELS, ModelSpec, load_model_config, model_from_config, resolve_model

# hidden 8, 2 heads of 4, 1 KV head, MLP 16, vocab 10, 3 layers
SMALL = {
    "num_hidden_layers": 3,
    "hidden_size": 8,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "intermediate_size": 16,
    "vocab_size": 10,
    "max_position_embeddings": 128,
    "torch_dtype": "bfloat16",
}


def test_a_dense_model_from_its_config_by_hand():
    m = model_from_config(SMALL, "small")
    assert (m.head_dim, m.num_kv_heads, m.dtype_bytes, m.max_position_embeddings) == (4, 1, 2, 128)
    # attention 2 × 8 × 8 (Q, O) + 2 × 8 × 4 (K, V) = 192; MLP 3 × 8 × 16 = 384; norms 16
    assert m.layer_params == 592
    assert m.total_params == 3 * 592 + 2 * 10 * 8 + 8  # untied embedding and LM head, final norm
    assert m.matmul_flops_per_token == 2 * 3 * (192 + 384)
    assert m.kv_bytes_per_token == 2 * 3 * 1 * 4 * 2
    assert m.weight_bytes == m.total_params * 2


def test_a_mixture_of_experts_counts_active_experts_for_flops_and_all_for_weights():
    config = SMALL | {
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 6,
        "tie_word_embeddings": True,
    }
    m = model_from_config(config, "moe")
    expert = 3 * 8 * 6
    assert m.layer_params == 192 + 4 * expert + 8 * 4 + 16  # router 8 × 4
    assert m.matmul_flops_per_token == 2 * 3 * (192 + 2 * expert + 8 * 4)
    assert m.total_params == 3 * m.layer_params + 10 * 8 + 8  # tied: one embedding matrix


def test_shipped_configs_match_the_published_parameter_counts():
    published_b = {
        "llama-2-7b": 6.74,
        "llama-2-70b": 68.98,
        "llama-3-8b": 8.03,
        "llama-3.1-70b": 70.55,
        "llama-3.1-405b": 405.85,
        "mistral-7b": 7.24,
        "qwen2.5-7b": 7.62,
        "qwen2.5-72b": 72.71,
        "qwen3-30b-a3b": 30.53,
    }
    for name, billions in published_b.items():
        assert MODELS.get(name).total_params / 1e9 == pytest.approx(billions, rel=2e-3), name
    assert MODELS.get("qwen3-30b-a3b").is_moe and MODELS.get("llama-3-8b").profile_dir == "Meta-Llama-3-8B"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_hidden_layers": None}, r"config num_hidden_layers = None, expected an integer ≥ 1"),
        ({"hidden_size": -8}, r"config hidden_size = -8, expected an integer ≥ 1"),
        ({"num_attention_heads": 0}, r"config num_attention_heads = 0, expected an integer ≥ 1"),
        ({"vocab_size": -1}, r"config vocab_size = -1, expected an integer ≥ 0"),
        ({"torch_dtype": "int4"}, r"config torch_dtype = 'int4', expected one of"),
        (
            {"num_experts": 4, "num_experts_per_tok": 5},
            r"experts_per_token = 5, expected an integer in \[1, num_experts",
        ),
    ],
)
def test_a_bad_config_names_the_key_and_value(change, message):
    with pytest.raises(ValueError, match=message):
        model_from_config(SMALL | change, "bad")


def test_a_model_needs_its_size_one_way_or_another():
    with pytest.raises(ValueError, match="give num_params or the MLP width"):
        ModelSpec(name="x", num_layers=1, num_q_heads=1, num_kv_heads=1, head_dim=1, hidden_size=1)


def test_a_config_file_or_folder_resolves_and_an_unknown_name_is_refused(tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"text_config": SMALL}))
    assert load_model_config(folder).name == "my-model"
    assert resolve_model(str(folder / "config.json")).layer_params == 592
    assert resolve_model("llama-3-8b") is MODELS.get("llama-3-8b")
    with pytest.raises(ValueError, match=r"model = 'nope', expected one of .* or a path to a config.json"):
        resolve_model("nope")
    for missing in (str(tmp_path / "gone" / "config.json"), "gone.json"):
        with pytest.raises(ValueError, match=r"model = '.*gone.*': no such file or folder, expected a path to a"):
            resolve_model(missing)
    (folder / "config.json").write_text("{")
    with pytest.raises(ValueError, match="not JSON"):
        load_model_config(folder)
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_model_config(tmp_path / "absent.json")


def test_gpu_table_keeps_the_short_names_for_the_80_gb_sxm_parts():
    a100, h100, h200 = GPUS.get("a100"), GPUS.get("h100"), GPUS.get("h200")
    assert (a100.memory_bytes, a100.peak_dense_bf16_flops, a100.hbm_bytes_per_s) == (80 * GIB_BYTES, 312e12, 2.039e12)
    assert (h100.memory_bytes, h100.peak_dense_bf16_flops, h100.peak_dense_fp8_flops) == (
        80 * GIB_BYTES,
        989e12,
        1979e12,
    )
    assert (h200.hbm_bytes_per_s, h200.profile_of) == (4.8e12, "h100")
    assert all(GPUS.get(name).datasheet for name in GPUS.names())
