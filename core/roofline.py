"""Roofline step time for any model on any GPU, with efficiencies fitted on the bundled profiles.

**Non-attention time** of a step of ``n`` batch tokens on one GPU of a tensor-parallel group of
``tp``::

    roofline_s(n) = max(n × F / tp / (peak_bf16 × mfu),  W(n) / tp / (hbm × hbm_efficiency))
                    + layers × layer_launch_s

``F`` is the model's matmul FLOPs per token (:attr:`~kvcost.core.specs.ModelSpec.matmul_flops_per_token`);
``W(n)`` the block weights read in the step: every weight of a dense model, and for a mixture of
experts the attention weights plus the experts the step's tokens touch, ``E × (1 − (1 − k/E)^n)``
of the ``E`` experts in expectation when each token picks ``k`` uniformly (the standard count of
distinct draws). The launch term is the per-layer kernel-launch and small-operator time that
dominates a step of a few tokens. This is the roofline of Williams, Waterman & Patterson (2009,
CACM 52(4)) with one efficiency per roof, as LLMCompass (Zhang et al. 2024) and AIConfigurator
price GEMMs.

**Fitted on the bundled measured profiles** (:func:`fit_roofline`; :data:`FITTED_ROOFLINES` pins
the result, and a test refits it): per GPU, least squares on the log of the per-step time of every
Vidur point (1–4,096 or 1–32,768 tokens) of every bundled model and tensor-parallel degree (1, 2, 4, 8):

=====  =====  ==============  =============  =========================================
GPU    mfu    hbm_efficiency  layer_launch   relative error (median / P90 / max)
=====  =====  ==============  =============  =========================================
a100   0.612  0.884           66.9 µs        5.2 % / 15.1 % / 56 % (Llama-3-8B, Llama-2-7B)
h100   0.576  0.941           63.0 µs        7.6 % / 21.2 % / 88 % (Llama-2-7B, Llama-2-70B)
=====  =====  ==============  =============  =========================================

The largest errors are steps of one to a few tokens at tensor-parallel degree 8, where a block
takes 40–60 µs and the constant launch term overstates it. A GPU without bundled profiles uses
those of :attr:`~kvcost.core.specs.GpuSpec.profile_of` (the efficiencies are ratios to the
GPU's own peaks, so they carry over between parts of one architecture; the H200 is an H100 die
with faster memory).

**All-reduce** (tensor parallelism): two per layer (after the attention output projection and
after the MLP), each of ``n × hidden × dtype`` bytes, as Megatron-LM splits a block (Shoeybi et
al. 2019, §3). A ring all-reduce moves ``2 (tp − 1) / tp`` of the buffer over each GPU's link in
one direction (Patarasuk & Yuan 2009; NCCL's "bus bandwidth" convention)::

    allreduce_s(bytes) = link_latency_s + 2 (tp − 1) / tp × bytes / (link_efficiency × interconnect / 2)

``interconnect`` is the datasheet's both-directions figure per GPU, so half of it is one
direction. :data:`FITTED_LINKS` comes from Vidur's NCCL send/recv profiles of two GPUs on one
DGX node (:func:`fit_link`): a100 572 GB/s, 13.2 µs; h100 715 GB/s, 7.6 µs, i.e. 0.95 and 0.79 of
the datasheet's both-directions figure, read here as moving the tensor both ways (the only reading
under which the A100's figure stays under NVLink 3's 300 GB/s a direction).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvcost.core.profiles import load_vidur_profile, load_vidur_send_recv
from kvcost.core.specs import GPUS, MODELS, GpuSpec, ModelSpec


@dataclass(frozen=True)
class RooflineFit:
    """Efficiencies of one GPU (module docstring): ``mfu`` and ``hbm_efficiency`` in (0, 1.5],
    ``layer_launch_s`` ≥ 0 seconds per layer."""

    mfu: float
    hbm_efficiency: float
    layer_launch_s: float


@dataclass(frozen=True)
class LinkFit:
    """A GPU link: ``latency_s`` per collective and the share of the datasheet interconnect reached."""

    latency_s: float
    efficiency: float


FITTED_ROOFLINES: dict[str, RooflineFit] = {
    "a100": RooflineFit(mfu=0.6116, hbm_efficiency=0.8844, layer_launch_s=6.694e-05),
    "h100": RooflineFit(mfu=0.5760, hbm_efficiency=0.9414, layer_launch_s=6.299e-05),
}
""":func:`fit_roofline` on the bundled profiles, rounded to 4 significant digits."""

FITTED_LINKS: dict[str, LinkFit] = {
    "a100": LinkFit(latency_s=1.316e-05, efficiency=0.9525),
    "h100": LinkFit(latency_s=7.590e-06, efficiency=0.7944),
}
""":func:`fit_link` on the bundled send/recv profiles, rounded."""

#: (GPU, model) pairs with bundled profiles the fit uses: every tensor-parallel degree of each.
FIT_PROFILES: dict[str, tuple[str, ...]] = {"a100": ("llama-3-8b", "llama-2-7b"), "h100": ("llama-2-7b", "llama-2-70b")}

#: GPU → Vidur network system of its send/recv profile.
LINK_SYSTEMS: dict[str, str] = {"a100": "a100_dgx", "h100": "h100_dgx"}


def fitted_gpu(gpu: GpuSpec) -> str:
    """The GPU whose fits stand for ``gpu``: itself when fitted, else its ``profile_of``.

    Raises:
        KeyError: neither has a fit.
    """
    for name in (gpu.name, gpu.profile_of):
        if name in FITTED_ROOFLINES:
            return name
    raise KeyError(f"gpu {gpu.name!r} has no fitted roofline and no profile_of among {sorted(FITTED_ROOFLINES)}")


def block_weight_bytes(model: ModelSpec, num_tokens: np.ndarray | float) -> np.ndarray:
    """Weight bytes of all blocks read by a step of ``num_tokens`` tokens (experts touched only)."""
    n = np.asarray(num_tokens, dtype=np.float64)
    if not model.is_moe:
        return np.full_like(n, model.block_params * model.dtype_bytes)
    expert_params = 3 * model.hidden_size * model.moe_intermediate_size
    dense = model.layer_params - model.num_experts * expert_params - 2 * model.hidden_size
    touched = model.num_experts * (1.0 - (1.0 - model.experts_per_token / model.num_experts) ** n)
    return model.num_layers * (dense + touched * expert_params) * model.dtype_bytes


def roofline_s(
    model: ModelSpec, gpu: GpuSpec, num_tokens: np.ndarray | float, tp: int = 1, fit: RooflineFit | None = None
) -> np.ndarray:
    """Non-attention seconds of a step of ``num_tokens`` (array, ≥ 1) on one GPU of a ``tp`` group."""
    fit = fit or FITTED_ROOFLINES[fitted_gpu(gpu)]
    n = np.asarray(num_tokens, dtype=np.float64)
    compute_s = n * model.matmul_flops_per_token / tp / (gpu.peak_dense_bf16_flops * fit.mfu)
    memory_s = block_weight_bytes(model, n) / tp / (gpu.hbm_bytes_per_s * fit.hbm_efficiency)
    return np.maximum(compute_s, memory_s) + model.num_layers * fit.layer_launch_s


def allreduce_s(num_bytes: np.ndarray | float, tp: int, gpu: GpuSpec) -> np.ndarray:
    """Seconds of one ring all-reduce of ``num_bytes`` over ``tp`` GPUs (0 at ``tp`` 1).

    Raises:
        ValueError: ``tp`` > 1 on a GPU with no interconnect figure.
    """
    size = np.asarray(num_bytes, dtype=np.float64)
    if tp <= 1:
        return np.zeros_like(size)
    if gpu.interconnect_bytes_per_s <= 0:
        raise ValueError(f"gpu {gpu.name!r} has no interconnect_bytes_per_s, expected one for tp = {tp}")
    link = FITTED_LINKS[fitted_gpu(gpu)]
    one_way = link.efficiency * gpu.interconnect_bytes_per_s / 2
    return link.latency_s + 2 * (tp - 1) / tp * size / one_way


def step_allreduce_s(model: ModelSpec, gpu: GpuSpec, num_tokens: np.ndarray | float, tp: int) -> np.ndarray:
    """All-reduce seconds of a step of ``num_tokens``: two per layer of ``n × hidden × dtype`` bytes."""
    n = np.asarray(num_tokens, dtype=np.float64)
    return 2 * model.num_layers * allreduce_s(n * model.hidden_size * model.dtype_bytes, tp, gpu)


def profile_points(
    gpu: str, models: tuple[str, ...] | None = None
) -> list[tuple[ModelSpec, int, np.ndarray, np.ndarray]]:
    """``(model, tp, num_tokens, measured_s)`` of every bundled profile of ``gpu`` (the models of
    :data:`FIT_PROFILES`, or ``models``) at every tensor-parallel degree."""
    points = []
    for name in models or FIT_PROFILES[gpu]:
        model = MODELS.get(name)
        for tp in (1, 2, 4, 8):
            profile = load_vidur_profile(gpu, model.profile_dir, tp)
            points.append((model, tp, profile.num_tokens.astype(np.float64), profile.total_s(model.num_layers)))
    return points


def fit_roofline(gpu: str, models: tuple[str, ...] | None = None) -> tuple[RooflineFit, np.ndarray]:
    """Fit :class:`RooflineFit` for ``gpu`` (a key of :data:`FIT_PROFILES`) on its bundled profiles
    (of ``models`` only, when given: to measure the fit on the profiles it left out).

    Returns the fit and the relative errors ``|predicted / measured − 1|`` of every point.
    """
    from scipy.optimize import least_squares  # lazy: scipy's optimizer is only needed to refit

    spec, points = GPUS.get(gpu), profile_points(gpu, models)

    def residuals(theta: np.ndarray) -> np.ndarray:
        return log_errors(RooflineFit(*np.exp(theta)), spec, points)

    result = least_squares(residuals, np.log([0.6, 0.7, 2e-5]))
    fit = RooflineFit(*(float(v) for v in np.exp(result.x)))
    return fit, np.exp(np.abs(residuals(result.x))) - 1.0


def log_errors(fit: RooflineFit, gpu: GpuSpec, points: list) -> np.ndarray:
    """``log(predicted / measured)`` of every point of :func:`profile_points` under ``fit`` on ``gpu``."""
    return np.concatenate([np.log(roofline_s(m, gpu, n, tp, fit)) - np.log(t) for m, tp, n, t in points])


def fit_link(gpu: str) -> LinkFit:
    """Fit :class:`LinkFit` for ``gpu`` (a key of :data:`LINK_SYSTEMS`) on the bundled send/recv
    profile of two GPUs on one node: time = latency + bytes / bandwidth, least squares in relative
    error; efficiency = bandwidth ÷ the datasheet's interconnect figure."""
    frame = load_vidur_send_recv(LINK_SYSTEMS[gpu])
    frame = frame[frame["devices_per_node"] == 2]
    size_bytes = frame["size"].to_numpy(dtype=np.float64) * 2  # fp16 elements (Vidur's GraphedCollective)
    time_s = frame["time_s"].to_numpy()
    design = np.vstack([np.ones_like(size_bytes), size_bytes]).T / time_s[:, None]
    (latency_s, s_per_byte), *_ = np.linalg.lstsq(design, np.ones_like(time_s), rcond=None)
    return LinkFit(float(latency_s), float(1.0 / s_per_byte / GPUS.get(gpu).interconnect_bytes_per_s))
