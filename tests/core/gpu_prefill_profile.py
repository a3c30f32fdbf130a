"""Prefill and decode step times of a random-weight Llama-3-8B on a real GPU, to check the step-time model
on a GPU it has no measured profile for (``docs/step-time-model.md``, "The H200, measured once").

Run on a machine with an NVIDIA GPU, PyTorch and transformers (not collected by pytest; the device
machine of ``../.library/device``)::

    python3 tests/core/gpu_prefill_profile.py --out prefill.json

What it measures: one request's prefill of ``L`` tokens with nothing cached, the model's forward
pass over the prompt plus the logits of its last token only (as an engine computes them), in bf16
with PyTorch's scaled-dot-product attention (its flash kernel on Hopper). The weights are random:
the time of a dense forward pass does not depend on their values. Each length is timed with CUDA
events, ``--repeats`` times after ``--warm-up`` runs, and the median kept; then again replayed
from a captured CUDA graph, which removes the launch cost per operator.

What it is not: a vLLM step. Eagerly, PyTorch launches one kernel per operator; the graph replay
removes that, but neither has an engine's fused RMSNorm and rotary kernels. So it is close to an
engine's prefill where the GEMMs dominate (long prompts) and further from it on short ones. A
dense bf16 GEMM of 8192³ is timed too, for the GPU's reachable FLOP/s.

Prefills after a cached prefix: ``new`` tokens attending to ``cached + new`` K/V rows
(:func:`_layers_ms`), what a cache hit leaves to compute, eager and from a CUDA graph.

Decode steps: ``batch`` sequences of ``context`` tokens each, one token per sequence, through the
model's own layers reading preallocated K/V (:func:`_layers_ms`), eager and from a CUDA graph.

Output: JSON ``{"gpu", "torch", "gemm_tflops", "prefill_ms": {L: median}, "prefill_cuda_graph_ms":
{L: median}, "prefill_after_cached_ms": {"N+C": [eager, graph]}, "decode_step_ms": {"BxC": [eager,
graph]}}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

#: Llama-3-8B's shape, the model of every bench cell: the bundled config kvcost's step-time model reads
#: (read as a file, so that the script runs where kvcost is not installed).
MODEL_CONFIG = Path(__file__).resolve().parents[2] / "data" / "bundled" / "model_configs" / "llama-3-8b.json"
#: Config fields transformers' ``LlamaConfig`` takes from it (the rest are kvcost's or informative).
SHAPE_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "max_position_embeddings",
    "tie_word_embeddings",
)
PROMPT_TOKENS = (128, 256, 512, 1024, 2048, 4096, 8192)
#: Prefills after a cached prefix timed: (new tokens, cached tokens).
CACHED_POINTS = ((512, 0), (512, 2048), (512, 8192), (2048, 6144))
#: Decode steps timed: (batch, context tokens per sequence).
DECODE_POINTS = ((1, 1024), (16, 1024), (64, 1024), (64, 4096))


def _median_ms(torch, fn, warm_up: int, repeats: int) -> float:
    """Median of ``repeats`` CUDA-event timings of ``fn()`` after ``warm_up`` untimed calls, ms."""
    for _ in range(warm_up):
        fn()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def _graphed_ms(torch, fn, warm_up: int, repeats: int) -> float:
    """:func:`_median_ms` of ``fn()`` replayed from a captured CUDA graph (no launch cost per operator,
    as an engine's graphs); NaN when it cannot be captured."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()  # warm-up on the side stream, as capture requires
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
    except (RuntimeError, TypeError, ValueError) as exc:
        print(f"CUDA graph capture failed: {type(exc).__name__}: {exc}")
        return float("nan")
    return _median_ms(torch, graph.replay, warm_up, repeats)


def _layers_ms(torch, model, batch: int, new: int, cached: int, warm_up: int, repeats: int) -> tuple[float, float]:
    """One step of ``batch`` sequences computing ``new`` tokens each after ``cached`` tokens in the KV cache:
    (eager, CUDA graph) medians, ms. A decode step is ``new`` = 1; a prefill after a cached prefix is
    ``batch`` = 1.

    The model's own layers over the new tokens: RMSNorm, the Q/K/V and output projections, attention
    reading ``cached + new`` K/V rows per sequence and layer (random, preallocated; the new tokens' K/V
    is computed but not written, and rotary embedding is left out: neither changes the bytes read or
    the FLOPs much), the MLP, and the LM head on the last token. Grouped-query attention: each KV head
    attends with its group of query heads stacked as query rows (the same arithmetic, in one standard
    ``scaled_dot_product_attention`` call); with several new tokens, query ``i`` sees rows ``≤ cached
    + i`` through a boolean mask (which sends PyTorch to its memory-efficient kernel, not the flash
    one); with one new token no mask is needed."""
    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim, group, rows = config.hidden_size // heads, heads // kv_heads, cached + new
    keys = [torch.randn(batch, kv_heads, rows, head_dim, device="cuda") for _ in model.model.layers]
    values = [torch.randn(batch, kv_heads, rows, head_dim, device="cuda") for _ in model.model.layers]
    visible = None
    if new > 1:  # the query rows of each KV head's group, group-major
        visible = torch.arange(rows, device="cuda")[None, :] <= cached + torch.arange(new, device="cuda")[:, None]
        visible = visible.repeat(group, 1)
    hidden = torch.randn(batch, new, config.hidden_size, device="cuda")

    def step():
        x = hidden
        for layer, k, v in zip(model.model.layers, keys, values, strict=True):
            h = layer.input_layernorm(x)
            attention = layer.self_attn
            q = attention.q_proj(h).view(batch, new, kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)
            attention.k_proj(h), attention.v_proj(h)
            o = torch.nn.functional.scaled_dot_product_attention(
                q.reshape(batch, kv_heads, group * new, head_dim), k, v, attn_mask=visible
            )
            o = o.view(batch, kv_heads, group, new, head_dim).permute(0, 3, 1, 2, 4)
            x = x + attention.o_proj(o.reshape(batch, new, config.hidden_size))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return model.lm_head(model.model.norm(x[:, -1:]))

    return _median_ms(torch, step, warm_up, repeats), _graphed_ms(torch, step, warm_up, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--warm-up", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    left, right = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    gemm_ms = _median_ms(torch, lambda: left @ right, args.warm_up, args.repeats)

    shape = json.loads(MODEL_CONFIG.read_text())
    config = LlamaConfig(**{k: shape[k] for k in SHAPE_FIELDS}, attn_implementation="sdpa")
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config)
    model.eval()

    def prefill(tokens: torch.Tensor) -> torch.Tensor:
        hidden = model.model(input_ids=tokens, use_cache=False).last_hidden_state
        return model.lm_head(hidden[:, -1:])

    prefill_ms, graphed_ms = {}, {}
    with torch.inference_mode():
        for length in PROMPT_TOKENS:
            tokens = torch.randint(0, config.vocab_size, (1, length), device="cuda")
            prefill_ms[length] = _median_ms(torch, lambda t=tokens: prefill(t), args.warm_up, args.repeats)
            graphed_ms[length] = _graphed_ms(torch, lambda t=tokens: prefill(t), args.warm_up, args.repeats)
            print(f"prefill {length:5d} tokens: eager {prefill_ms[length]:8.2f} ms, graph {graphed_ms[length]:8.2f} ms")
        cached_ms = {}
        for new, cached in CACHED_POINTS:
            key = f"{new}+{cached}"
            cached_ms[key] = _layers_ms(torch, model, 1, new, cached, args.warm_up, args.repeats)
            print(f"prefill {new} tokens after {cached} cached: eager / graph {cached_ms[key]} ms")
        decode_ms = {}
        for batch, context in DECODE_POINTS:
            key = f"{batch}x{context}"
            decode_ms[key] = _layers_ms(torch, model, batch, 1, context, args.warm_up, args.repeats)
            print(f"decode step {batch} × {context}: eager / graph {decode_ms[key]} ms")
    result = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "gemm_tflops": 2 * 8192**3 / (gemm_ms / 1e3) / 1e12,
        "prefill_ms": prefill_ms,
        "prefill_cuda_graph_ms": graphed_ms,
        "prefill_after_cached_ms": cached_ms,
        "decode_step_ms": decode_ms,
    }
    print(json.dumps(result))
    args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
