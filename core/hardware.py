"""Hardware and model specifications and the analytic step-time model.

:class:`StepTimeModel` gives the time of one continuous-batching step on one GPU:

    step_s = nonattention_s(num_tokens) + attention_s(prefill_flops, decode_context_tokens)
             + step_overhead_s

- **Non-attention operators** (norms, QKV/O projections, RoPE, MLP, residual adds,
  embedding) come from Microsoft Vidur's measured profiles
  (:mod:`kvcost.core.profiles`), linearly interpolated in the batch token count, used
  within their measured range only. Past the last measured point, and for a model or GPU
  without measurements, they come from the roofline of :mod:`kvcost.core.roofline`
  (efficiencies fitted on those profiles), joined continuously: beyond the last point
  ``measured_last × roofline(n) / roofline(last)``. With tensor parallelism, one GPU's
  shard (Vidur's rows of that degree where measured) plus two all-reduces per layer.
- **Attention** is not in those profiles and is modelled: prefill attention is
  compute-bound (causal FLOPs over cached + new tokens at a fraction of peak
  tensor-core throughput); decode attention is memory-bound (each decoding request
  reads its whole KV cache once per step).

Defaults and their sources (all module-level constants, units in names):

- :data:`DEFAULT_ATTENTION_FLOPS_EFFICIENCY` = 0.5 — FlashAttention-2 (Dao, 2023,
  arXiv:2307.08691) reaches 50–73 % of A100 peak in the forward pass; 0.5 is the low
  end, since serving batches mix short chunks and causal masking. On another GPU the
  attention kernels are taken to reach the same share of what its GEMMs reach as on
  the A100: 0.5 × (its fitted MFU ÷ the A100's), 0.47 on an H100.
- :data:`DEFAULT_DECODE_BANDWIDTH_EFFICIENCY` = 0.7 — assumption: fraction of peak HBM
  bandwidth a paged decode-attention kernel achieves.
- :data:`DEFAULT_STEP_OVERHEAD_S` = 0.004 — assumption: per-step CPU scheduling,
  input preparation, sampling and kernel-launch overhead (a few ms in vLLM-class engines).
- :data:`DEFAULT_ACTIVATION_RESERVE_BYTES` = 2 GiB — assumption: activation and
  workspace memory held back from the KV cache at an 8192-token budget.
- :data:`DEFAULT_GPU_MEMORY_UTILIZATION` = 0.9 — vLLM's default
  ``gpu_memory_utilization`` (vllm/engine/arg_utils.py).
- GPU and model figures: :mod:`kvcost.core.specs` (datasheets; ``config.json`` files).
"""

from __future__ import annotations

import numpy as np

from kvcost.core.profiles import OperatorProfile, load_vidur_profile
from kvcost.core.roofline import FITTED_ROOFLINES, fitted_gpu, roofline_s, step_allreduce_s
from kvcost.core.specs import (  # noqa: F401  (re-exported: the specs' historical home)
    BF16_BYTES,
    FLOPS_PER_MAC,
    GIB_BYTES,
    GPUS,
    MODELS,
    GpuSpec,
    ModelSpec,
    resolve_model,
)

DEFAULT_TOKEN_BUDGET = 8192
"""Default max tokens per step (chunked-prefill budget)."""

DEFAULT_ATTENTION_FLOPS_EFFICIENCY = 0.5
"""Fraction of peak dense bf16 FLOP/s reached by prefill attention on an A100 (FlashAttention-2 paper)."""

DEFAULT_DECODE_BANDWIDTH_EFFICIENCY = 0.7
"""Fraction of peak HBM bandwidth reached by decode attention (assumption)."""

DEFAULT_STEP_OVERHEAD_S = 0.004
"""Per-step CPU scheduling / launch overhead in seconds (assumption)."""

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
"""vLLM's default ``gpu_memory_utilization`` (vllm/engine/arg_utils.py)."""

DEFAULT_ACTIVATION_RESERVE_BYTES = 2 * GIB_BYTES
"""Memory held back for activations and workspace (assumption)."""


def default_attention_efficiency(gpu: GpuSpec) -> float:
    """Default prefill-attention efficiency on ``gpu``: 0.5 × its fitted MFU ÷ the A100's (module
    docstring); 0.5 for a GPU with no fitted roofline (a hand-made test GPU)."""
    try:
        return DEFAULT_ATTENTION_FLOPS_EFFICIENCY * FITTED_ROOFLINES[fitted_gpu(gpu)].mfu / FITTED_ROOFLINES["a100"].mfu
    except KeyError:
        return DEFAULT_ATTENTION_FLOPS_EFFICIENCY


DERIVED_PROFILES: dict[tuple[str, str], tuple[str, str]] = {
    ("h100", "Meta-Llama-3-8B"): ("a100", "Llama-2-7b-hf"),
}
"""(gpu, model_dir) without a measured profile → (base gpu, reference model_dir).

The profile is derived by :func:`derived_profile` from the model's profile on the
base GPU, scaled by the reference model's measured target/base ratio. Llama-2-7B is
the reference for Llama-3-8B because both have hidden size 4096.
"""


def _ratio_at(tokens: np.ndarray, num: OperatorProfile, den: OperatorProfile, field: str):
    """num/den of ``field`` interpolated at ``tokens``, clamped to the shared measured range."""
    hi = min(num.num_tokens[-1], den.num_tokens[-1])
    lo = max(num.num_tokens[0], den.num_tokens[0])
    x = np.clip(tokens, lo, hi)
    top = np.interp(x, num.num_tokens, getattr(num, field))
    bottom = np.interp(x, den.num_tokens, getattr(den, field))
    return top / bottom


def derived_profile(
    base: OperatorProfile, reference_base: OperatorProfile, reference_target: OperatorProfile
) -> OperatorProfile:
    """Estimate a model's profile on a target GPU from a similar model measured on both GPUs.

    At each of ``base``'s token counts n, ``per_layer_s`` and ``once_s`` are scaled by
    reference_target / reference_base, both interpolated at n. Beyond the reference's
    last measured point the ratio at that point is used (both GPUs are compute-bound
    there, so the ratio is stable). Used for Llama-3-8B on H100: A100 Llama-3-8B ×
    (H100 / A100 of Llama-2-7B).
    """
    tokens = base.num_tokens
    return OperatorProfile(
        num_tokens=tokens,
        per_layer_s=base.per_layer_s * _ratio_at(tokens, reference_target, reference_base, "per_layer_s"),
        once_s=base.once_s * _ratio_at(tokens, reference_target, reference_base, "once_s"),
        source=f"derived: {base.source} × ({reference_target.source} / {reference_base.source})",
    )


def profile_for(model: ModelSpec, gpu: GpuSpec, tp: int = 1) -> OperatorProfile | None:
    """The bundled profile of ``model`` on ``gpu`` at tensor-parallel degree ``tp``, derived per
    :data:`DERIVED_PROFILES` (degree 1); for a GPU measured on nothing, the profile of the GPU that
    stands for it (``gpu.profile_of``) scaled by their rooflines (:func:`roofline_scaled_profile`);
    or None where nothing is measured (the roofline then gives every point)."""
    measured = _measured_profile(model, gpu.name, tp)
    if measured is not None or not gpu.profile_of or gpu.profile_of == gpu.name:
        return measured
    reference_gpu = GPUS.get(gpu.profile_of)
    reference = profile_for(model, reference_gpu, tp)
    return None if reference is None else roofline_scaled_profile(reference, model, gpu, reference_gpu, tp)


def _measured_profile(model: ModelSpec, gpu_name: str, tp: int) -> OperatorProfile | None:
    """The bundled profile of ``model`` measured (or derived per :data:`DERIVED_PROFILES`) on ``gpu_name``."""
    key = (gpu_name, model.profile_dir)
    try:
        if key in DERIVED_PROFILES and tp == 1:
            base_gpu, reference_dir = DERIVED_PROFILES[key]
            return derived_profile(
                load_vidur_profile(base_gpu, model.profile_dir),
                load_vidur_profile(base_gpu, reference_dir),
                load_vidur_profile(gpu_name, reference_dir),
            )
        return load_vidur_profile(gpu_name, model.profile_dir, tp) if model.profile_dir else None
    except KeyError:
        return None


def roofline_scaled_profile(
    reference: OperatorProfile, model: ModelSpec, gpu: GpuSpec, reference_gpu: GpuSpec, tp: int
) -> OperatorProfile:
    """``reference`` (measured on ``reference_gpu``) moved to ``gpu``: at each measured token count n,
    ``per_layer_s`` and ``once_s`` × roofline(gpu, n) / roofline(reference_gpu, n).

    Why not the plain roofline on ``gpu``: the two GPUs share their fitted efficiencies
    (``profile_of``: the H200 has the H100's compute die), so the roofline's own error (median
    5–11 % on held-back profiles, ``docs/step-time-model.md``) is the same on both and cancels in
    the ratio; the measured shape is kept. The plain roofline put the H200 behind the H100 it has
    more bandwidth than (Llama-3-8B, 2,048 tokens: 58.6 against 50.4 ms), because the H100's figure
    was measured and the H200's was not; the ratio can only favour the GPU with more FLOP/s or bandwidth.
    """
    tokens = np.maximum(reference.num_tokens.astype(np.float64), 1.0)
    ratio = roofline_s(model, gpu, tokens, tp) / roofline_s(model, reference_gpu, tokens, tp)
    return OperatorProfile(
        num_tokens=reference.num_tokens,
        per_layer_s=reference.per_layer_s * ratio,
        once_s=reference.once_s * ratio,
        source=f"{reference.source} × roofline {gpu.name} / {reference_gpu.name}",
    )


def _require(ok: bool, field: str, value: object, expectation: str) -> None:
    """Raise ``ValueError`` naming ``field``, its value and the expectation unless ``ok``."""
    if not ok:
        raise ValueError(f"{field} = {value!r}: expected {expectation}")


def check_tensor_parallel(model: ModelSpec, tp: int) -> None:
    """Check that ``tp`` GPUs can split ``model``: an integer ≥ 1 dividing its attention (query) heads, as
    vLLM requires (each GPU holds whole heads).

    Raises:
        ValueError: ``tensor_parallel = 3: expected an integer >= 1 dividing the 64 attention heads``.
    """
    _require(
        isinstance(tp, int) and tp >= 1 and model.num_q_heads % tp == 0,
        "tensor_parallel",
        tp,
        f"an integer >= 1 dividing the {model.num_q_heads} attention heads",
    )


class StepTimeModel:
    """Time of one continuous-batching step of ``model`` on one ``gpu``.

    Construction is pure (no file IO); :meth:`for_hardware` loads the profile.
    The non-attention time for 0..``token_budget`` tokens is precomputed into a list,
    as Vidur's predictor precomputes its per-``num_tokens`` predictions
    (``SklearnExecutionTimePredictor._predict_for_compute_models``) and only looks
    them up per batch.

    Args:
        model, gpu: specifications.
        profile: measured non-attention operator profile of ``model`` on ``gpu`` (one GPU's shard at
            ``tp``), or None: the roofline of :mod:`kvcost.core.roofline` at every point.
        tp: tensor-parallel degree (≥ 1, dividing the attention heads): a step's GEMMs, attention
            and KV are split over ``tp`` GPUs, and two all-reduces per layer join them.
        token_budget: max tokens per step (chunk size of :meth:`prefill_alone_s`), ≥ 1.
        attention_flops_efficiency: fraction of peak bf16 FLOP/s for prefill attention, (0, 1];
            None = :func:`default_attention_efficiency` of the GPU.
        decode_bandwidth_efficiency: fraction of peak HBM bandwidth for decode attention, (0, 1].
        step_overhead_s: fixed seconds added to every step, ≥ 0.
    """

    def __init__(
        self,
        model: ModelSpec,
        gpu: GpuSpec,
        profile: OperatorProfile | None,
        *,
        tp: int = 1,
        token_budget: int = DEFAULT_TOKEN_BUDGET,
        attention_flops_efficiency: float | None = None,
        decode_bandwidth_efficiency: float = DEFAULT_DECODE_BANDWIDTH_EFFICIENCY,
        step_overhead_s: float = DEFAULT_STEP_OVERHEAD_S,
    ) -> None:
        _require(
            isinstance(token_budget, int | np.integer) and token_budget >= 1,
            "token_budget",
            token_budget,
            "an integer >= 1",
        )
        _require(
            attention_flops_efficiency is None or 0 < attention_flops_efficiency <= 1,
            "attention_flops_efficiency",
            attention_flops_efficiency,
            "a value in (0, 1]",
        )
        _require(
            0 < decode_bandwidth_efficiency <= 1,
            "decode_bandwidth_efficiency",
            decode_bandwidth_efficiency,
            "a value in (0, 1]",
        )
        _require(step_overhead_s >= 0, "step_overhead_s", step_overhead_s, "a value >= 0")
        check_tensor_parallel(model, tp)
        if attention_flops_efficiency is None:
            attention_flops_efficiency = default_attention_efficiency(gpu)
        self.model, self.gpu, self.profile, self.tp = model, gpu, profile, tp
        self.token_budget = int(token_budget)
        self.attention_flops_efficiency = attention_flops_efficiency
        self.decode_bandwidth_efficiency = decode_bandwidth_efficiency
        self.step_overhead_s = step_overhead_s
        self._table_s: list[float] = self._interpolate_s(np.arange(token_budget + 1)).tolist()
        self._attention_flops_per_s = gpu.peak_dense_bf16_flops * attention_flops_efficiency
        self._decode_s_per_context_token = self.kv_bytes_per_token_per_gpu / (
            gpu.hbm_bytes_per_s * decode_bandwidth_efficiency
        )
        heads_per_gpu = model.num_q_heads // tp
        self._attention_flops_per_token_pair = 2 * FLOPS_PER_MAC * model.num_layers * heads_per_gpu * model.head_dim

    @property
    def kv_bytes_per_token_per_gpu(self) -> int:
        """KV bytes one GPU of the group holds per token: its ``ceil(kv_heads / tp)`` KV heads (a
        KV head is replicated when there are fewer KV heads than GPUs, as vLLM does)."""
        kv_heads = -(-self.model.num_kv_heads // self.tp)
        return 2 * self.model.num_layers * kv_heads * self.model.head_dim * self.model.dtype_bytes

    @classmethod
    def for_hardware(cls, model_name: str, gpu_name: str, tp: int = 1, **settings) -> StepTimeModel:
        """Build from a model name or ``config.json`` path (:func:`~kvcost.core.specs.resolve_model`)
        and a GPU name (``GPUS``), loading the bundled profile where one is measured."""
        model, gpu = resolve_model(model_name), GPUS.get(gpu_name)
        return cls(model, gpu, profile_for(model, gpu, tp), tp=tp, **settings)

    def __repr__(self) -> str:
        return (
            f"StepTimeModel(model={self.model.name!r}, gpu={self.gpu.name!r}, "
            f"token_budget={self.token_budget}, profile={self.profile.source!r})"
        )

    def _interpolate_s(self, tokens: np.ndarray) -> np.ndarray:
        """Non-attention seconds at ``tokens`` (array), all-reduces included.

        Measured points are interpolated linearly; below the first one its time is used
        (launch-bound); past the last one, the roofline scaled to meet it there
        (``measured_last × roofline(n) / roofline(last)``); without a profile, the roofline.
        0 tokens cost 0.
        """
        x = np.asarray(tokens, dtype=np.float64)
        if self.profile is None:
            result = roofline_s(self.model, self.gpu, np.maximum(x, 1.0), self.tp)
        else:
            xp = self.profile.num_tokens.astype(np.float64)
            yp = self.profile.total_s(self.model.num_layers)
            result = np.interp(x, xp, yp)
            beyond = x > xp[-1]
            if beyond.any():
                roof = roofline_s(self.model, self.gpu, np.append(x[beyond], xp[-1]), self.tp)
                result[beyond] = yp[-1] * roof[:-1] / roof[-1]
        result = result + step_allreduce_s(self.model, self.gpu, x, self.tp)
        result[x <= 0] = 0.0
        return result

    def nonattention_s(self, num_tokens: int) -> float:
        """Seconds of all non-attention operators for a step of ``num_tokens`` batch tokens.

        per_layer_s(num_tokens) × num_layers + once_s(num_tokens), linearly interpolated
        between measured points, the roofline beyond them (:meth:`_interpolate_s`), plus the
        all-reduces of tensor parallelism.
        """
        if 0 <= num_tokens <= self.token_budget:
            return self._table_s[num_tokens]
        _require(num_tokens >= 0, "num_tokens", num_tokens, "a value >= 0")
        return float(self._interpolate_s(np.array([num_tokens]))[0])

    def prefill_attention_flops(self, new_tokens: int, context_tokens: int) -> float:
        """Causal attention FLOPs (QK^T and AV) for ``new_tokens`` after ``context_tokens``.

        4 × layers × q_heads × head_dim × new × (context + (new + 1) / 2): each new token
        attends to all context tokens and, causally, to the new tokens up to itself.
        Cached (reused) prefix tokens count as context.
        """
        return self.attention_flops_of_pairs(new_tokens * (context_tokens + (new_tokens + 1) / 2))

    def attention_flops_of_pairs(self, token_pairs: float) -> float:
        """Attention FLOPs (QK^T and AV) of ``token_pairs`` (query, key) pairs, all layers: 4 × layers
        × q_heads × head_dim per pair. A sum of :meth:`prefill_attention_flops`' pair counts gives
        the FLOPs of several prefills at once (the work queued ahead of a request)."""
        return float(self._attention_flops_per_token_pair * token_pairs)

    def attention_s(self, prefill_flops: float, decode_context_tokens: int) -> float:
        """Seconds of attention in one step.

        prefill_flops / (peak bf16 FLOP/s × attention_flops_efficiency)
        + decode_context_tokens × kv_bytes_per_token_per_gpu / (HBM B/s × decode_bandwidth_efficiency),
        where ``decode_context_tokens`` sums the KV lengths of all decoding requests.
        """
        return prefill_flops / self._attention_flops_per_s + decode_context_tokens * self._decode_s_per_context_token

    def step_s(self, num_tokens: int, prefill_flops: float, decode_context_tokens: int) -> float:
        """Seconds of one step: nonattention_s + attention_s + step_overhead_s."""
        return (
            self.nonattention_s(num_tokens)
            + self.attention_s(prefill_flops, decode_context_tokens)
            + self.step_overhead_s
        )

    def prefill_alone_s(self, new_tokens: int, context_tokens: int = 0) -> float:
        """Seconds to prefill ``new_tokens`` on an idle worker in chunks of ``token_budget``.

        Sum of :meth:`step_s` over the chunks; each chunk's context includes
        ``context_tokens`` (cached prefix) and the earlier chunks. 0 tokens → 0.
        """
        _require(
            new_tokens >= 0 and context_tokens >= 0,
            "new_tokens, context_tokens",
            (new_tokens, context_tokens),
            "values >= 0",
        )
        total_s, done = 0.0, 0
        while done < new_tokens:
            chunk = min(self.token_budget, new_tokens - done)
            flops = self.prefill_attention_flops(chunk, context_tokens + done)
            total_s += self.step_s(chunk, flops, 0)
            done += chunk
        return total_s

    def kv_capacity_tokens(
        self,
        gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
        activation_reserve_bytes: int = DEFAULT_ACTIVATION_RESERVE_BYTES,
    ) -> int:
        """Tokens of KV cache that fit on the GPU.

        floor((memory_bytes × gpu_memory_utilization − weight_bytes / tp − activation_reserve_bytes)
        / kv_bytes_per_token_per_gpu): every GPU of the group holds its shard of the weights and
        of each token's KV.

        Raises:
            ValueError: bad arguments, or no room for a single token (message names the values).
        """
        _require(0 < gpu_memory_utilization <= 1, "gpu_memory_utilization", gpu_memory_utilization, "a value in (0, 1]")
        _require(activation_reserve_bytes >= 0, "activation_reserve_bytes", activation_reserve_bytes, "a value >= 0")
        weight_bytes = self.model.weight_bytes / self.tp
        free_bytes = self.gpu.memory_bytes * gpu_memory_utilization - weight_bytes - activation_reserve_bytes
        tokens = int(free_bytes // self.kv_bytes_per_token_per_gpu)
        if tokens <= 0:
            raise ValueError(
                f"model = {self.model.name!r} leaves no KV capacity on {self.gpu.name} with tensor_parallel "
                f"{self.tp}, expected a higher tensor_parallel or a GPU with more memory: "
                f"memory_bytes={self.gpu.memory_bytes} × "
                f"gpu_memory_utilization={gpu_memory_utilization} − "
                f"weight_bytes / tp={weight_bytes:.0f} − "
                f"activation_reserve_bytes={activation_reserve_bytes} = {free_bytes:.0f} bytes, "
                f"less than kv_bytes_per_token_per_gpu={self.kv_bytes_per_token_per_gpu}"
            )
        return tokens

    def kv_capacity_blocks(
        self,
        block_size_tokens: int,
        gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
        activation_reserve_bytes: int = DEFAULT_ACTIVATION_RESERVE_BYTES,
    ) -> int:
        """Whole KV blocks of ``block_size_tokens`` that fit (see :meth:`kv_capacity_tokens`)."""
        _require(block_size_tokens >= 1, "block_size_tokens", block_size_tokens, "a value >= 1")
        tokens = self.kv_capacity_tokens(gpu_memory_utilization, activation_reserve_bytes)
        return tokens // block_size_tokens
