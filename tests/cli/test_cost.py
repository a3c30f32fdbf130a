"""``kvcost cost``: prefill and decode-step predictions for any shipped model, GPU and TP degree."""

import json

import pytest
from typer.testing import CliRunner

from kvcost.cli import app
from kvcost.core.hardware import StepTimeModel

runner = CliRunner()


def test_json_figures_are_the_step_time_models():
    args = ["cost", "--model", "llama-2-70b", "--gpu", "h100", "--tp", "4", "--prompt-tokens", "2048"]
    result = runner.invoke(app, [*args, "--cached-tokens", "512", "--batch", "8", "--context-tokens", "1000", "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout)
    m = StepTimeModel.for_hardware("llama-2-70b", "h100", tp=4)
    assert figures == {"prefill_s": m.prefill_alone_s(2048, 512), "decode_step_s": m.step_s(8, 0.0, 8000)}


def test_a_config_path_works_and_a_long_prompt_is_warned_not_refused(tmp_path):
    config = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128}
    (tmp_path / "config.json").write_text(json.dumps(config | {"vocab_size": 100, "max_position_embeddings": 256}))
    result = runner.invoke(app, ["cost", "--model", str(tmp_path), "--gpu", "l40s", "--prompt-tokens", "300"])
    assert result.exit_code == 0, result.output
    assert "warning: prompt of 300 tokens is past" in result.stderr and "roofline" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "gpt-4"], "--model = 'gpt-4', expected one of llama-2-70b"),
        (["--gpu", "v100"], "unknown gpu 'v100'"),
        (["--prompt-tokens", "0"], "--prompt-tokens = 0, expected an integer ≥ 1"),
        (["--tp", "3"], "tp = 3: expected an integer >= 1 dividing the 32 attention heads"),
    ],
)
def test_bad_input_is_one_line_and_status_2(args, message):
    base = {"--model": "llama-3-8b", "--gpu": "a100", "--prompt-tokens": "10"}
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    result = runner.invoke(app, ["cost", *[x for pair in base.items() for x in pair]])
    assert result.exit_code == 2 and message in result.stderr


def test_a_profile_stands_for_model_and_gpu(tmp_path):
    from tests.helpers import MEASURED_STEP as TRUE
    from tests.helpers import measured_profile as profile

    path = profile().save(tmp_path / "cpu-tiny.json")
    result = runner.invoke(app, ["cost", "--profile", str(path), "--prompt-tokens", "512", "--batch", "8",
                                 "--context-tokens", "56", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout)
    assert figures["decode_step_s"] == pytest.approx(float(TRUE.step_s(8, 0.0, 448)), rel=1e-9)
    missing = runner.invoke(app, ["cost", "--prompt-tokens", "5"])
    assert missing.exit_code == 2 and "expected --model and --gpu, or --profile" in missing.stderr
