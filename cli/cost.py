"""``kvcost cost``: the predicted prefill time of one request and the decode step time of a batch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from kvcost.cli.common import console, err_console, guard
from kvcost.core.engine_profile import EngineProfile
from kvcost.core.hardware import GPUS, StepTimeModel


def cost_figures(
    model: str | None,
    gpu: str | None,
    tp: int,
    prompt_tokens: int,
    cached_tokens: int,
    batch: int,
    context_tokens: int,
    profile: Path | None = None,
) -> tuple[dict[str, float], StepTimeModel]:
    """``{"prefill_s", "decode_step_s"}`` and the step-time model behind them.

    ``prefill_s``: one request alone (batch 1), ``prompt_tokens`` new tokens after ``cached_tokens``
    cached ones, in chunks of the token budget (:meth:`StepTimeModel.prefill_alone_s`).
    ``decode_step_s``: one step of ``batch`` sequences decoding one token each, each with
    ``context_tokens`` of KV (the time per output token of that batch).

    With ``profile`` (a ``kvcost profile`` file) the measured engine's step-time model is used;
    ``model`` and ``gpu`` must then be None and ``tp`` 1 (the engine fixes them).

    Raises:
        ValueError: a count out of range (the message names it), an unknown model or GPU, a
            ``tp`` that does not divide the attention heads, neither a profile nor a model and GPU,
            or a profile with a model, GPU or ``tp``.
        FileNotFoundError: no such profile file.
    """
    for name, value, low in (
        ("prompt_tokens", prompt_tokens, 1),
        ("cached_tokens", cached_tokens, 0),
        ("batch", batch, 1),
        ("context_tokens", context_tokens, 0),
        ("tp", tp, 1),
    ):
        if value < low:
            raise ValueError(f"{name} = {value}, expected an integer ≥ {low}")
    if profile is not None:
        given = [f"--{name} = {value!r}" for name, value, unset in (("model", model, None), ("gpu", gpu, None),
                 ("tp", tp, 1)) if value != unset]  # fmt: skip
        if given:
            raise ValueError(f"{', '.join(given)} with --profile, expected none: the profile's engine fixes them")
        step_model = EngineProfile.load(profile).step_time_model()
    elif model is None or gpu is None:
        missing = "model" if model is None else "gpu"
        raise ValueError(f"--{missing} is missing, expected --model and --gpu, or --profile")
    elif gpu not in GPUS:
        raise ValueError(f"gpu = {gpu!r}, expected one of {', '.join(GPUS.names())}")
    else:
        step_model = StepTimeModel.for_hardware(model, gpu, tp=tp)
    figures = {
        "prefill_s": step_model.prefill_alone_s(prompt_tokens, cached_tokens),
        "decode_step_s": step_model.step_s(batch, 0.0, batch * context_tokens),
    }
    return figures, step_model


def memory_warning(step_model: StepTimeModel, batch: int, context_tokens: int) -> str | None:
    """What does not fit in one GPU's memory at the model's tensor-parallel degree, or None if all fits.

    Per GPU: the weights ÷ ``tp`` (:attr:`ModelSpec.weight_bytes`), then with the KV of ``batch``
    sequences of ``context_tokens`` ÷ ``tp`` (:attr:`ModelSpec.kv_bytes_per_token`), against the GPU's
    memory (:attr:`GpuSpec.memory_bytes`; nothing is said for a GPU without one).
    The figures are still printed: they are what such a step would take if it ran.
    """
    capacity = step_model.gpu.memory_bytes
    tp, model = step_model.tp, step_model.model
    weights = model.weight_bytes / tp
    kv = batch * context_tokens * model.kv_bytes_per_token / tp
    where = f"one {step_model.gpu.name}'s {capacity / 2**30:.0f} GiB at tp {tp}"
    if capacity <= 0 or weights + kv <= capacity:
        return None
    if weights > capacity:
        return f"warning: {model.name}'s weights need {weights / 2**30:.0f} GiB a GPU, more than {where}"
    return (
        f"warning: the weights and the KV of {batch} × {context_tokens} tokens need "
        f"{(weights + kv) / 2**30:.0f} GiB a GPU, more than {where}"
    )


def cost(
    prompt_tokens: Annotated[int, typer.Option(help="New prompt tokens of the request to prefill.")],
    model: Annotated[str | None, typer.Option(help="Model name (e.g. llama-3.1-70b) or path to a config.json.")] = None,
    gpu: Annotated[
        str | None, typer.Option(help="GPU (a100, a100-40gb, h100, h100-pcie, h200, b200, l40s, mi300x).")
    ] = None,
    tp: Annotated[int, typer.Option(help="Tensor-parallel degree.")] = 1,
    cached_tokens: Annotated[int, typer.Option(help="Tokens of its prefix already cached.")] = 0,
    batch: Annotated[int, typer.Option(help="Sequences in the decode batch.")] = 1,
    context_tokens: Annotated[int, typer.Option(help="KV tokens of each decoding sequence.")] = 1024,
    profile: Annotated[Path | None, typer.Option(help="A kvcost profile file: its measured engine instead.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON (keys end in _s).")] = False,
) -> None:
    """Predicted prefill time of one request and decode step time of a batch, for capacity planning."""
    figures, step_model = guard(
        lambda: cost_figures(model, gpu, tp, prompt_tokens, cached_tokens, batch, context_tokens, profile),
        aliases={"tensor_parallel": "tp"},
    )
    limit = step_model.model.max_position_embeddings
    for what, tokens in (("prompt", prompt_tokens + cached_tokens), ("decode context", context_tokens)):
        if limit and tokens > limit:
            err_console.print(
                f"warning: {what} of {tokens} tokens is past {step_model.model.name}'s max_position_embeddings {limit}"
            )
    if (warning := memory_warning(step_model, batch, context_tokens)) is not None:
        err_console.print(warning)
    if as_json:
        print(json.dumps(figures))
        return
    source = step_model.profile.source if step_model.profile is not None else "roofline (no measured profile)"
    console.print(f"{step_model.model.name} on {step_model.gpu.name} × tp {step_model.tp}; non-attention: {source}")
    console.print(
        f"prefill of {prompt_tokens} tokens after {cached_tokens} cached: {figures['prefill_s'] * 1e3:.2f} ms"
    )
    console.print(
        f"decode step, {batch} sequences of {context_tokens} tokens: {figures['decode_step_s'] * 1e3:.2f} ms "
        f"({batch / figures['decode_step_s']:.0f} tokens/s)"
    )
