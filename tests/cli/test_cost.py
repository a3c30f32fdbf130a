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
        (["--gpu", "v100"], "--gpu = 'v100', expected one of a100, a100-40gb"),
        (["--prompt-tokens", "0"], "--prompt-tokens = 0, expected an integer ≥ 1"),
        (["--tp", "3"], "error: --tp = 3: expected an integer >= 1 dividing the 32 attention heads"),
        (["--gpu", None], "--gpu is missing, expected --model and --gpu, or --profile"),
        (["--model", None, "--gpu", "tpu"], "--model is missing, expected --model and --gpu, or --profile"),
    ],
)
def test_bad_input_is_one_line_and_status_2(args, message):
    base = {"--model": "llama-3-8b", "--gpu": "a100", "--prompt-tokens": "10"}
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    result = runner.invoke(app, ["cost", *[x for pair in base.items() if pair[1] is not None for x in pair]])
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


def test_a_config_that_is_not_an_object_or_has_a_zero_width_is_refused_by_name(tmp_path):
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "zero.json").write_text(
        json.dumps({"num_hidden_layers": 2, "hidden_size": 0, "num_attention_heads": 4})
    )
    for name, message in (("list", "config is a list, expected a JSON object"),
                          ("zero", "config hidden_size = 0, expected an integer ≥ 1")):  # fmt: skip
        result = runner.invoke(app, ["cost", "--model", str(tmp_path / f"{name}.json"), "--gpu", "a100",
                                     "--prompt-tokens", "10"])  # fmt: skip
        assert result.exit_code == 2 and message in result.stderr, result.output


def test_a_profile_with_a_model_gpu_or_tp_is_refused_and_what_does_not_fit_is_warned(tmp_path):
    from tests.helpers import measured_profile as profile

    path = str(profile().save(tmp_path / "cpu-tiny.json"))
    both = runner.invoke(app, ["cost", "--profile", path, "--gpu", "h100", "--tp", "2", "--prompt-tokens", "5"])
    assert both.exit_code == 2
    assert "--gpu = 'h100', --tp = 2 with --profile, expected none: the profile's engine fixes them" in both.stderr
    big = runner.invoke(app, ["cost", "--model", "llama-3.1-405b", "--gpu", "a100", "--prompt-tokens", "5", "--json"])
    assert (
        big.exit_code == 0 and "llama-3.1-405b's weights need 756 GiB a GPU, more than one a100's 80 GiB" in big.stderr
    )
    kv = runner.invoke(app, ["cost", "--model", "llama-3.1-8b", "--gpu", "h100", "--batch", "32",
                             "--context-tokens", "131072", "--prompt-tokens", "5"])  # fmt: skip
    assert "the weights and the KV of 32 × 131072 tokens need 527 GiB a GPU, more than one h100's" in kv.stderr
    fits = runner.invoke(app, ["cost", "--model", "llama-3-8b", "--gpu", "a100", "--prompt-tokens", "5"])
    assert "warning" not in fits.stderr
