"""Build the tiny random Llama model the end-to-end tests serve with vLLM (no hub access needed).

Run with the engine venv's python (it needs ``torch``, ``tokenizers`` and ``transformers``)::

    .venv-engine/bin/python tests/e2e/tiny_model.py OUT_DIR

Deterministic: the byte-level BPE tokenizer (vocabulary 4,096) is trained on the repository's
``README.md`` and ``docs/*.md`` (sorted), and the weights are drawn with seed 0. The model is a
2-layer Llama (hidden 256, 4 heads of 64, about 3.4 M parameters, bf16) with a chat template
``<s><|role|>\\n{content}<|end|>\\n… <|assistant|>\\n``. The files are written to a temporary sibling
folder then renamed, so ``OUT_DIR`` is either absent or complete; an existing ``OUT_DIR`` is kept.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VOCAB_SIZE = 4096
SPECIAL_TOKENS = ["<s>", "</s>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def training_files() -> list[str]:
    """The text the tokenizer learns from: README.md then docs/*.md, sorted (paths as strings)."""
    return [str(REPO / "README.md")] + sorted(str(p) for p in (REPO / "docs").glob("*.md"))


def build_tokenizer():
    """Train the byte-level BPE tokenizer; returns a ``PreTrainedTokenizerFast`` that prepends ``<s>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train(training_files(), trainer)
    bos_id = tokenizer.token_to_id("<s>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos_id)]
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(tokenizer):
    """A randomly initialised 2-layer ``LlamaForCausalLM`` in bf16 (seed 0) sized to the tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=64,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(torch.bfloat16)


def portable_tokenizer_config(path: Path) -> None:
    """Name the class ``PreTrainedTokenizerFast`` and inline the chat template in ``tokenizer_config.json``.

    transformers 5 writes ``"tokenizer_class": "TokenizersBackend"`` and the template to a separate
    ``chat_template.jinja``, which transformers 4 (a router's own environment may pin it) cannot load.
    """
    config = json.loads(path.read_text())
    config.update(tokenizer_class="PreTrainedTokenizerFast", chat_template=CHAT_TEMPLATE)
    path.write_text(json.dumps(config, indent=2) + "\n")


def is_complete(out_dir: Path) -> bool:
    """True when ``out_dir`` holds every file vLLM needs to load the model."""
    return all((out_dir / name).is_file() for name in MODEL_FILES)


def build(out_dir: Path) -> None:
    """Write the tokenizer and model to ``out_dir`` (via a temporary sibling folder); no-op when complete."""
    if is_complete(out_dir):
        print(f"{out_dir}: already complete")
        return
    started = time.perf_counter()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer.save_pretrained(tmp)
    portable_tokenizer_config(tmp / "tokenizer_config.json")
    model.save_pretrained(tmp, safe_serialization=True)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{out_dir}: {n_params:,} parameters, vocabulary {len(tokenizer)}, {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tiny_model.py OUT_DIR")
    build(Path(sys.argv[1]).resolve())
