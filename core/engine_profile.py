"""A step-time model measured on a live engine (``kvcost profile``), and how kvcost loads it.

``kvcost profile`` (:mod:`kvcost.serving.engines.profiler`) times a live OpenAI-compatible engine:
single requests with ``max_tokens`` 1 at low load (prefill of ``L`` new tokens, less the network
round trip) and the gaps between streamed tokens of ``B`` concurrent streams (decode steps of a
batch of ``B``). :func:`fit_engine_profile` fits the step-time model's form to them::

    step_s(n, pairs, context) = overhead_s + max(n × s_per_token, weight_floor_s)
                                + pairs × s_per_attention_pair + context × s_per_context_token

the same terms :class:`~kvcost.core.hardware.StepTimeModel` composes from a GPU's profile: a fixed
cost per step, the non-attention GEMMs (weight-read bound below ``weight_floor_s / s_per_token``
tokens, compute bound above), causal attention over the prompt's token pairs, and the decode
batch reading its KV. A measured prefill also holds the request's first-token work once
(sampling, the output's first detokenization: kvcost's ``F`` term), so a prefill point is
``step_s + first_token_s`` and a decode point ``step_s``; without that sixth term the fit puts
``F`` into every step's overhead (measured against the tiny CPU engine: held-back decode error
47.5 % with five terms). Six parameters, fitted by least squares on the log of the times (each
point weighs by its relative error, whatever its length), all positive.

Every third point of each series is held back from the fit and reported
(:attr:`EngineProfile.held_out_errors`): the fit's error on points it did not see.

:meth:`EngineProfile.step_time_model` turns a profile into a ``StepTimeModel`` of a GPU type named
after the profile, so ``--profile FILE`` adds that type to the router, the simulator and the
gateway: snapshots and fleets name it like ``a100``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from kvcost.core.hardware import DEFAULT_ACTIVATION_RESERVE_BYTES, DEFAULT_GPU_MEMORY_UTILIZATION, StepTimeModel
from kvcost.core.profiles import OperatorProfile
from kvcost.core.reporting import read_json
from kvcost.core.specs import GpuSpec, resolve_model

#: Format version of a profile file.
PROFILE_VERSION = 1


@dataclass(frozen=True)
class StepFit:
    """The six parameters of a measured engine (module docstring), seconds, all > 0: five of a step
    and ``first_token_s``, the first-token work a prefill point holds besides its step."""

    overhead_s: float
    s_per_token: float
    weight_floor_s: float
    s_per_attention_pair: float
    s_per_context_token: float
    first_token_s: float = 0.0

    def step_s(self, num_tokens: np.ndarray, pairs: np.ndarray, context_tokens: np.ndarray) -> np.ndarray:
        """Seconds of steps of ``num_tokens`` batch tokens, ``pairs`` attention pairs, ``context_tokens`` of KV."""
        n = np.asarray(num_tokens, dtype=np.float64)
        compute_s = np.maximum(n * self.s_per_token, self.weight_floor_s)
        return (
            self.overhead_s + compute_s + pairs * self.s_per_attention_pair + context_tokens * self.s_per_context_token
        )


@dataclass(frozen=True)
class EngineProfile:
    """A measured engine: its points, the fit and the fit's errors.

    Attributes:
        name: the GPU type name it registers (e.g. ``cpu-tiny``).
        model: the model served (name or ``config.json`` path, :func:`~kvcost.core.specs.resolve_model`).
        engine_url: where it was measured.
        rtt_s: the round trip subtracted from each prefill time.
        prefill: ``[prompt_tokens, seconds, held_out]`` per point.
        decode: ``[batch, context_tokens, step_seconds, held_out]`` per point.
        fit: the fitted :class:`StepFit`.
        token_budget: tokens per step of the engine (``max_num_batched_tokens``).
        kv_capacity_blocks, block_size_tokens: the engine's KV cache, when it reported them (0 = unknown).
        held_out_errors: ``{"prefill_median", "prefill_max", "decode_median", "decode_max"}``,
            relative errors on the held-back points.
        wall_s: seconds the measurement took.
    """

    name: str
    model: str
    engine_url: str
    rtt_s: float
    prefill: list[list[float]]
    decode: list[list[float]]
    fit: StepFit
    token_budget: int = 8192
    kv_capacity_blocks: int = 0
    block_size_tokens: int = 0
    held_out_errors: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0

    def save(self, path: str | Path) -> Path:
        """Write as JSON; returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"version": PROFILE_VERSION, **asdict(self)}, indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> EngineProfile:
        """Read a profile written by :meth:`save`.

        Raises:
            FileNotFoundError: no such file.
            ValueError: not a kvcost engine profile of this version (the message says which key).
        """
        path = Path(path)
        data = read_json(path, "profile", "one written by kvcost profile")
        if not isinstance(data, dict) or data.get("version") != PROFILE_VERSION:
            found = data.get("version") if isinstance(data, dict) else None
            raise ValueError(f"profile {str(path)!r}: version = {found!r}, expected {PROFILE_VERSION}")
        data.pop("version")
        try:
            return cls(**{**data, "fit": StepFit(**data["fit"])})
        except (KeyError, TypeError) as err:
            raise ValueError(f"profile {str(path)!r}: {err}, expected the keys kvcost profile writes") from err

    def step_time_model(self, token_budget: int | None = None) -> StepTimeModel:
        """A :class:`~kvcost.core.hardware.StepTimeModel` that reproduces :attr:`fit` exactly.

        Its GPU is a :class:`~kvcost.core.specs.GpuSpec` named :attr:`name` whose peak FLOP/s and
        bandwidth are the fitted attention and KV rates (efficiencies 1), whose memory holds the
        engine's reported KV capacity, and whose non-attention profile is ``max(n × s_per_token,
        weight_floor_s)`` at four points (exact at every integer token count: it is piecewise linear
        with one knee, kept between two adjacent integers).
        """
        model = resolve_model(self.model)
        fit = self.fit
        flops_per_pair = 2 * 2 * model.num_layers * model.num_q_heads * model.head_dim  # StepTimeModel's
        kv_tokens = self.kv_capacity_blocks * self.block_size_tokens or 1 << 20
        memory_bytes = model.weight_bytes + DEFAULT_ACTIVATION_RESERVE_BYTES + kv_tokens * model.kv_bytes_per_token
        gpu = GpuSpec(
            name=self.name,
            memory_bytes=math.ceil(memory_bytes / DEFAULT_GPU_MEMORY_UTILIZATION) + 1,
            peak_dense_bf16_flops=flops_per_pair / fit.s_per_attention_pair,
            hbm_bytes_per_s=model.kv_bytes_per_token / fit.s_per_context_token,
            datasheet=f"measured by kvcost profile at {self.engine_url}",
        )
        knee = max(1, min(math.floor(fit.weight_floor_s / fit.s_per_token), (1 << 22) - 2))
        tokens = sorted({1, knee, knee + 1, 1 << 22})  # exact at every integer token count
        compute_s = np.maximum(np.array(tokens, dtype=np.float64) * fit.s_per_token, fit.weight_floor_s)
        profile = OperatorProfile(
            num_tokens=tokens,
            per_layer_s=compute_s / model.num_layers,
            once_s=np.zeros(len(tokens)),
            source=f"kvcost profile {self.name}",
        )
        return StepTimeModel(
            model,
            gpu,
            profile,
            token_budget=token_budget or self.token_budget,
            attention_flops_efficiency=1.0,
            decode_bandwidth_efficiency=1.0,
            step_overhead_s=fit.overhead_s,
        )


def attention_pairs(prompt_tokens: np.ndarray) -> np.ndarray:
    """Causal attention pairs of a prompt prefilled from scratch: ``L (L + 1) / 2``."""
    length = np.asarray(prompt_tokens, dtype=np.float64)
    return length * (length + 1) / 2


def fit_engine_profile(prefill: np.ndarray, decode: np.ndarray) -> StepFit:
    """Fit :class:`StepFit` to prefill points ``(L, seconds)`` (one step of ``L`` tokens, no KV read,
    plus the first-token work) and decode points ``(B, K, seconds)`` (``B`` tokens, ``B × K`` KV
    tokens read).

    Raises:
        ValueError: fewer than 3 prefill or 2 decode points, or a time that is not > 0.
    """
    from scipy.optimize import least_squares  # lazy: only the profiler fits

    prefill, decode = np.asarray(prefill, dtype=np.float64), np.asarray(decode, dtype=np.float64)
    if len(prefill) < 3 or len(decode) < 2:
        raise ValueError(f"{len(prefill)} prefill and {len(decode)} decode points, expected at least 3 and 2")
    if np.any(prefill[:, -1] <= 0) or np.any(decode[:, -1] <= 0):
        raise ValueError("a measured time is not > 0: the round trip exceeded the request; measure at lower load")
    n = np.concatenate([prefill[:, 0], decode[:, 0]])
    pairs = np.concatenate([attention_pairs(prefill[:, 0]), np.zeros(len(decode))])
    context = np.concatenate([np.zeros(len(prefill)), decode[:, 0] * decode[:, 1]])
    is_prefill = np.arange(len(n)) < len(prefill)
    measured = np.concatenate([prefill[:, -1], decode[:, -1]])

    def residuals(theta: np.ndarray) -> np.ndarray:
        fit = StepFit(*np.exp(theta))
        return np.log(fit.step_s(n, pairs, context) + is_prefill * fit.first_token_s) - np.log(measured)

    low = measured.min()
    start = np.log([low / 2, measured.max() / n.max(), low / 4, 1e-9, 1e-9, low / 4])
    return StepFit(*(float(v) for v in np.exp(least_squares(residuals, start).x)))


def relative_errors(fit: StepFit, prefill: np.ndarray, decode: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``|predicted / measured − 1|`` of prefill points ``(L, s)`` and decode points ``(B, K, s)``."""
    prefill, decode = np.asarray(prefill, dtype=np.float64), np.asarray(decode, dtype=np.float64)
    p = (
        fit.step_s(prefill[:, 0], attention_pairs(prefill[:, 0]), 0.0) + fit.first_token_s
        if len(prefill)
        else np.zeros(0)
    )
    d = fit.step_s(decode[:, 0], 0.0, decode[:, 0] * decode[:, 1]) if len(decode) else np.zeros(0)
    return (
        np.abs(p / prefill[:, -1] - 1) if len(prefill) else p,
        np.abs(d / decode[:, -1] - 1) if len(decode) else d,
    )
