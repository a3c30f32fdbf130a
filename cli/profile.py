"""``kvcost profile``: measure a live engine's prefill and decode step times and fit a profile."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvcost.cli.common import console, guard


def _ints(text: str, name: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"{name} = {text!r}, expected comma-separated integers") from None


def profile(
    engine: Annotated[str, typer.Option(help="Base URL of an OpenAI-compatible engine (vLLM, SGLang).")],
    model: Annotated[str, typer.Option(help="The model it serves: a name (llama-3-8b) or a config.json path.")],
    out: Annotated[Path, typer.Option(help="Profile file to write (JSON); load it with --profile.")],
    name: Annotated[str, typer.Option(help="GPU type name the profile registers (snapshots and fleets use it).")] = "",
    prompt_tokens: Annotated[
        str, typer.Option(help="Prefill lengths, comma-separated.")
    ] = "16,32,64,128,256,384,512,768,1024,1536",
    batches: Annotated[str, typer.Option(help="Decode batch sizes, comma-separated.")] = "1,2,4,8,12,16,24,32",
    repeats: Annotated[int, typer.Option(help="Requests per prefill length (median kept).")] = 5,
    decode_tokens: Annotated[int, typer.Option(help="Output tokens of each decode stream.")] = 48,
    token_budget: Annotated[int, typer.Option(help="The engine's max_num_batched_tokens.")] = 8192,
    seed: Annotated[int, typer.Option(help="Seed of the random prompts.")] = 0,
) -> None:
    """Measure a live engine (prefill at low load, decode by concurrent streams), fit the step-time
    model to it, and write a profile that --profile loads in the router, the simulator and the gateway."""
    import httpx

    from kvcost.serving.engines.profiler import EngineProfiler, ProfilePlan

    def run():
        plan = ProfilePlan(
            prompt_tokens=_ints(prompt_tokens, "prompt_tokens"),
            batches=_ints(batches, "batches"),
            repeats=repeats,
            decode_tokens=decode_tokens,
            token_budget=token_budget,
        )
        profiler = EngineProfiler(engine, model, seed=seed)
        try:
            return profiler.measure(name or out.stem, plan, progress=lambda line: console.print(line))
        except httpx.HTTPError as err:
            raise ValueError(f"engine = {engine!r}: {err}") from err

    measured = guard(run)
    measured.save(out)
    fit, errors = measured.fit, measured.held_out_errors
    console.print(
        f"fit: overhead {fit.overhead_s * 1e3:.2f} ms, {fit.s_per_token * 1e6:.2f} µs a token "
        f"(floor {fit.weight_floor_s * 1e3:.2f} ms), {fit.s_per_attention_pair * 1e9:.3f} ns an attention pair, "
        f"{fit.s_per_context_token * 1e9:.2f} ns a KV token read; first-token work {fit.first_token_s * 1e3:.2f} ms"
    )
    console.print(
        f"held-out error: prefill median {errors['prefill_median']:.1%} (max {errors['prefill_max']:.1%}), "
        f"decode median {errors['decode_median']:.1%} (max {errors['decode_max']:.1%}); "
        f"{len(measured.prefill) + len(measured.decode)} points in {measured.wall_s:.0f} s → {out}"
    )
