"""Model and GPU specifications: models from their Hugging Face ``config.json``, GPUs from datasheets.

**Models.** A :class:`ModelSpec` holds what a decoder-only transformer's ``config.json`` says about
its shape: layers, hidden size, query and KV heads, head dim, MLP width, vocabulary, dtype, and
for a mixture of experts the expert count, experts per token and expert MLP width. The byte and
FLOP counts the step-time model needs follow from it (:attr:`ModelSpec.kv_bytes_per_token`,
:attr:`ModelSpec.weight_bytes`, :attr:`ModelSpec.matmul_flops_per_token`). Formula sources:

* KV bytes per token: 2 (K and V) × layers × KV heads × head dim × dtype bytes (vLLM's
  ``AttentionSpec.page_size_bytes`` ÷ block size; docs/architecture.md §7).
* Parameters of a Llama-style block (Vidur ``vidur/config/model_config.py`` and LLMCompass count
  the same GEMMs): Q and O projections ``hidden × heads·head_dim`` each, K and V
  ``hidden × kv_heads·head_dim`` each; a gated MLP three ``hidden × intermediate`` matrices (gate,
  up, down); a mixture of experts that many per expert plus the ``hidden × experts`` router;
  two RMSNorm vectors. Plus the ``vocab × hidden`` embedding, the LM head unless
  ``tie_word_embeddings``, and the final norm. Biases (Qwen2's QKV biases) are under 0.1 % and left out.
* Matmul FLOPs per token: 2 per multiply-accumulate over the per-token GEMMs of every layer, with
  only the ``num_experts_per_tok`` active experts of a mixture (the forward-pass count of Kaplan
  et al. 2020, §2.1, without attention scores, which :class:`~kvcost.core.hardware.StepTimeModel`
  prices from the context length).

A table of well-known configs ships with kvcost (``data/bundled/model_configs/<name>.json``, the
fields above copied from each model's ``config.json`` on the Hugging Face hub);
:func:`resolve_model` also takes a path to any ``config.json``.

**GPUs.** :data:`GPUS` holds peak dense bf16 and fp8 tensor FLOP/s (without sparsity), HBM bandwidth
and capacity, and the interconnect bandwidth per GPU, each from the vendor datasheet named on its
entry. ``a100`` and ``h100`` are the 80 GB SXM parts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from kvcost.core.registry import Registry
from kvcost.core.reporting import read_json

GIB_BYTES = 2**30
"""Bytes in one GiB."""

GB_BYTES = 10**9
"""Bytes in one (decimal) GB, the unit of datasheet bandwidths."""

BF16_BYTES = 2
"""Bytes per bf16 (or fp16) element."""

FLOPS_PER_MAC = 2
"""One multiply-accumulate counts as two floating-point operations."""

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1, "fp8": 1}
"""``torch_dtype`` of a ``config.json`` → bytes per element."""


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a decoder-only transformer, as in its Hugging Face ``config.json``.

    Attributes:
        name: the name kvcost knows it by.
        num_layers: ``num_hidden_layers``.
        num_q_heads, num_kv_heads: ``num_attention_heads``, ``num_key_value_heads``.
        head_dim: ``head_dim`` (default ``hidden_size / num_attention_heads``).
        hidden_size: ``hidden_size``.
        num_params: total parameters (every expert counted); 0 = computed from the shape.
        dtype_bytes: bytes per weight and KV element (``torch_dtype``; 2 for bf16/fp16).
        profile_dir: the model's folder in Vidur's profile tree ("" = none measured).
        intermediate_size: dense MLP width (0 = unknown; only models given by parameter count).
        vocab_size: vocabulary (0 = unknown).
        num_experts, experts_per_token, moe_intermediate_size: mixture of experts (0 = dense).
        max_position_embeddings: the context the model was trained for (0 = unknown).
        tie_word_embeddings: the LM head shares the embedding matrix.
    """

    name: str
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    num_params: float = 0.0
    dtype_bytes: int = BF16_BYTES
    profile_dir: str = ""
    intermediate_size: int = 0
    vocab_size: int = 0
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    max_position_embeddings: int = 0
    tie_word_embeddings: bool = False

    def __post_init__(self) -> None:
        for field in ("num_layers", "num_q_heads", "num_kv_heads", "head_dim", "hidden_size", "dtype_bytes"):
            value = getattr(self, field)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"model {self.name!r}: {field} = {value!r}, expected an integer ≥ 1")
        if self.num_experts and not 1 <= self.experts_per_token <= self.num_experts:
            raise ValueError(
                f"model {self.name!r}: experts_per_token = {self.experts_per_token!r}, "
                f"expected an integer in [1, num_experts = {self.num_experts}]"
            )
        if not self.num_params and not self.intermediate_size and not self.num_experts:
            raise ValueError(f"model {self.name!r}: give num_params or the MLP width (intermediate_size)")

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes per token: 2 (K and V) × num_layers × num_kv_heads × head_dim × dtype_bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def _attention_params_per_layer(self) -> int:
        q_out = self.num_q_heads * self.head_dim
        kv_out = self.num_kv_heads * self.head_dim
        return 2 * self.hidden_size * q_out + 2 * self.hidden_size * kv_out

    def _mlp_params_per_layer(self, experts: int) -> int:
        if self.num_experts:
            return experts * 3 * self.hidden_size * self.moe_intermediate_size + self.hidden_size * self.num_experts
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def layer_params(self) -> float:
        """Parameters of one block (every expert), embeddings excluded."""
        return self._attention_params_per_layer + self._mlp_params_per_layer(self.num_experts) + 2 * self.hidden_size

    @property
    def block_params(self) -> float:
        """Parameters of all blocks (every expert), embeddings excluded; for a model given by
        ``num_params`` alone, those less the embeddings."""
        if self.intermediate_size or self.num_experts:
            return float(self.num_layers * self.layer_params)
        return float(self.total_params - self.embedding_params)

    @property
    def embedding_params(self) -> int:
        """Embedding plus LM head (once when tied) parameters."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    @property
    def total_params(self) -> float:
        """All parameters: ``num_params`` when given, else counted from the shape (module docstring)."""
        if self.num_params:
            return float(self.num_params)
        return float(self.num_layers * self.layer_params + self.embedding_params + self.hidden_size)

    @property
    def weight_bytes(self) -> float:
        """Bytes of the weights: parameters × dtype bytes."""
        return self.total_params * self.dtype_bytes

    @property
    def matmul_flops_per_token(self) -> float:
        """FLOPs of every layer's per-token GEMMs (active experts only), attention scores and LM head excluded.

        Without the MLP width (a model given by ``num_params`` alone), the non-embedding parameters
        stand for the GEMMs (dense models: within 1 % of the count above).
        """
        if self.intermediate_size or self.num_experts:
            active = self._attention_params_per_layer + self._mlp_params_per_layer(self.experts_per_token)
            return float(FLOPS_PER_MAC * self.num_layers * active)
        return float(FLOPS_PER_MAC * self.block_params)

    @property
    def is_moe(self) -> bool:
        """True for a mixture of experts."""
        return self.num_experts > 0


def model_from_config(config: Mapping, name: str, profile_dir: str | None = None) -> ModelSpec:
    """A :class:`ModelSpec` from a parsed Hugging Face ``config.json``.

    Reads ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``
    (default: the attention heads), ``head_dim`` (default ``hidden_size / num_attention_heads``),
    ``intermediate_size``, ``vocab_size``, ``torch_dtype`` (default bfloat16), and for a mixture of
    experts ``num_experts`` / ``num_local_experts`` / ``n_routed_experts``, ``num_experts_per_tok``
    and ``moe_intermediate_size`` (default ``intermediate_size``); ``max_position_embeddings`` and
    ``tie_word_embeddings``. A multimodal config's ``text_config`` is read instead when present.
    ``profile_dir`` None: the config's own ``kvcost_profile_dir`` (bundled configs name their Vidur
    profiles there), else none.

    Raises:
        ValueError: the config is not a JSON object, a required key is missing or not a positive
            integer, or the dtype is unknown (the message names the key, the value and the model).
    """
    if not isinstance(config, Mapping):
        raise ValueError(f"model {name!r}: config is a {type(config).__name__}, expected a JSON object")
    if profile_dir is None:
        profile_dir = config.get("kvcost_profile_dir", "")
    config = config.get("text_config", config)

    def integer(key: str, default: int | None = None, low: int = 0) -> int:
        value = config.get(key, default)
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= low):
            raise ValueError(f"model {name!r}: config {key} = {value!r}, expected an integer ≥ {low}")
        return value

    heads = integer("num_attention_heads", low=1)
    hidden = integer("hidden_size", low=1)
    dtype = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"model {name!r}: config torch_dtype = {dtype!r}, expected one of {sorted(DTYPE_BYTES)}")
    experts = next((integer(k) for k in ("num_experts", "num_local_experts", "n_routed_experts") if k in config), 0)
    return ModelSpec(
        name=name,
        num_layers=integer("num_hidden_layers", low=1),
        num_q_heads=heads,
        num_kv_heads=integer("num_key_value_heads", heads),
        head_dim=integer("head_dim") if config.get("head_dim") is not None else hidden // max(heads, 1),
        hidden_size=hidden,
        dtype_bytes=DTYPE_BYTES[dtype],
        profile_dir=profile_dir,
        intermediate_size=integer("intermediate_size", 0),
        vocab_size=integer("vocab_size", 0),
        num_experts=experts,
        experts_per_token=integer("num_experts_per_tok", 0) if experts else 0,
        moe_intermediate_size=integer("moe_intermediate_size", config.get("intermediate_size", 0)) if experts else 0,
        max_position_embeddings=integer("max_position_embeddings", 0),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
    )


def load_model_config(path: str | Path, name: str | None = None) -> ModelSpec:
    """A :class:`ModelSpec` from a ``config.json`` file, or a folder holding one.

    Raises:
        FileNotFoundError: no such file (or no ``config.json`` in the folder).
        ValueError: not JSON, or not a usable config (:func:`model_from_config`).
    """
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    config = read_json(path, "model config", "a Hugging Face config.json")
    default_name = path.parent.name if path.name == "config.json" else path.stem
    return model_from_config(config, name or default_name)


def _bundled_configs() -> Registry[ModelSpec]:
    """The shipped configs: one ``<name>.json`` per model in ``data/bundled/model_configs``."""
    registry: Registry[ModelSpec] = Registry("model")
    folder = resources.files("kvcost.data") / "bundled" / "model_configs"
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            name = entry.name.removesuffix(".json")
            config = json.loads(entry.read_text())
            registry.add(name, model_from_config(config, name))
    return registry


MODELS: Registry[ModelSpec] = _bundled_configs()
"""Well-known models by name (the shipped configs)."""


def resolve_model(name_or_path: str) -> ModelSpec:
    """A shipped model by name (:data:`MODELS`), or the model of a ``config.json`` path.

    Raises:
        ValueError: neither a known name nor an existing path (the message lists the names, or says
            that the path is missing when the value looks like one: it has a ``/`` or ends in ``.json``).
    """
    if name_or_path in MODELS.names():
        return MODELS.get(name_or_path)
    path = Path(name_or_path)
    if path.exists():
        return load_model_config(path)
    if "/" in name_or_path or name_or_path.endswith(".json"):
        raise ValueError(f"model = {name_or_path!r}: no such file or folder, expected a path to a config.json")
    raise ValueError(
        f"model = {name_or_path!r}, expected one of {', '.join(MODELS.names())} or a path to a config.json"
    )


@dataclass(frozen=True)
class GpuSpec:
    """One GPU's datasheet figures (``name`` is also its folder in Vidur's profile tree).

    Attributes:
        name: kvcost's name for it.
        memory_bytes: memory capacity, bytes. Datasheet "80 GB" parts hold 80 GiB (``nvidia-smi``
            shows 81,920 MiB on an A100 80GB), so capacities are taken in GiB.
        peak_dense_bf16_flops: dense (no sparsity) bf16 tensor FLOP/s.
        hbm_bytes_per_s: HBM bandwidth, bytes/s.
        peak_dense_fp8_flops: dense fp8 tensor FLOP/s (0 = no fp8 tensor cores).
        interconnect_bytes_per_s: GPU-to-GPU bandwidth per GPU as the datasheet gives it (NVLink or
            Infinity Fabric, both directions summed; PCIe where there is no GPU link), bytes/s.
        profile_of: the GPU whose measured profiles and fitted efficiencies stand for this one
            ("" = itself; e.g. the H200 has the H100's compute die).
        datasheet: where the figures come from.
    """

    name: str
    memory_bytes: int
    peak_dense_bf16_flops: float
    hbm_bytes_per_s: float
    peak_dense_fp8_flops: float = 0.0
    interconnect_bytes_per_s: float = 0.0
    profile_of: str = ""
    datasheet: str = ""


GPUS: Registry[GpuSpec] = Registry("gpu")
_A100 = "NVIDIA A100 Tensor Core GPU datasheet (2021): BF16 312 TFLOPS dense; NVLink 600 GB/s"
_H100 = "NVIDIA H100 Tensor Core GPU datasheet (2023): SXM BF16 989 / FP8 1,979 TFLOPS dense"
for _gpu in (
    GpuSpec("a100", 80 * GIB_BYTES, 312e12, 2.039e12, 0.0, 600e9, "", _A100 + "; 80GB SXM: 2,039 GB/s HBM2e"),
    GpuSpec("a100-40gb", 40 * GIB_BYTES, 312e12, 1.555e12, 0.0, 600e9, "a100", _A100 + "; 40GB SXM: 1,555 GB/s"),
    GpuSpec("h100", 80 * GIB_BYTES, 989e12, 3.35e12, 1979e12, 900e9, "", _H100 + ", 3.35 TB/s HBM3, NVLink 900 GB/s"),
    GpuSpec(
        "h100-pcie",
        80 * GIB_BYTES,
        756e12,
        2.0e12,
        1513e12,
        600e9,
        "h100",
        "NVIDIA H100 datasheet (2023): PCIe BF16 756 / FP8 1,513 TFLOPS dense, 2 TB/s, NVLink bridge 600 GB/s",
    ),
    GpuSpec(
        "h200",
        141 * GIB_BYTES,
        989e12,
        4.8e12,
        1979e12,
        900e9,
        "h100",
        "NVIDIA H200 Tensor Core GPU datasheet (2024): SXM 141 GB HBM3e, 4.8 TB/s, BF16 989 / FP8 1,979 dense",
    ),
    GpuSpec(
        "b200",
        180 * GIB_BYTES,
        2.25e15,
        8.0e12,
        4.5e15,
        1800e9,
        "h100",
        "NVIDIA DGX B200 datasheet (2024): 1,440 GB over 8 GPUs, 64 TB/s HBM3e; FP8 72 PFLOPS sparse "
        "over 8 (4.5 PF dense each), BF16 2.25 PF dense; NVLink 5 1.8 TB/s",
    ),
    GpuSpec(
        "l40s",
        48 * GIB_BYTES,
        362e12,
        0.864e12,
        733e12,
        64e9,
        "a100",
        "NVIDIA L40S datasheet (2023): BF16 362 / FP8 733 TFLOPS dense, 48 GB GDDR6 864 GB/s, PCIe Gen4 x16",
    ),
    GpuSpec(
        "mi300x",
        192 * GIB_BYTES,
        1307.4e12,
        5.3e12,
        2614.9e12,
        896e9,
        "h100",
        "AMD Instinct MI300X data sheet (2023): BF16 1,307.4 / FP8 2,614.9 TFLOPS dense, 192 GB HBM3 "
        "5.3 TB/s, Infinity Fabric 896 GB/s",
    ),
):
    GPUS.add(_gpu.name, _gpu)
