import json

import duckdb
import pytest
from typer.testing import CliRunner

from kvcost.cli import app

runner = CliRunner()


def _experiment(tmp_path, name, *extra):
    out = tmp_path / name
    args = ["experiment", "--duration-s", "45", "--out", str(out), "--db", str(tmp_path / "log.duckdb"), *extra]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return out, result.output


@pytest.mark.slow
def test_experiment_writes_outputs_and_is_deterministic(tmp_path):
    out1, output = _experiment(tmp_path, "a")
    out2, _ = _experiment(tmp_path, "b")
    assert (out1 / "summary.json").read_bytes() == (out2 / "summary.json").read_bytes()
    summary = json.loads((out1 / "summary.json").read_text())
    assert set(summary["configs"]) == {"balanced_nocache", "balanced_cache", "cost_aware", "cost_aware_tiered"}
    assert summary["requests"] == summary["configs"]["cost_aware"]["completed"] > 0
    assert summary["configs"]["balanced_nocache"]["hit_ratio"] == 0.0
    assert len(summary["diagnosis"]) == 4
    for name in ("report.md", "ttft_cdf.png", "queued_prefill_tokens.png"):
        assert (out1 / name).stat().st_size > 0
    assert "cache gain" in output and "report:" in output
    con = duckdb.connect(str(tmp_path / "log.duckdb"))
    assert con.execute("SELECT count(*) FROM runs").fetchone() == (8,)  # appended, never overwritten
    n_requests = con.execute("SELECT count(*) FROM requests").fetchone()[0]
    assert n_requests == 8 * summary["requests"]
    assert con.execute("SELECT count(*) FROM candidates").fetchone()[0] == 4 * n_requests


def test_seed_changes_the_result(tmp_path):
    out1, _ = _experiment(tmp_path, "a", "--duration-s", "20")
    out2, _ = _experiment(tmp_path, "b", "--duration-s", "20", "--seed", "1")
    assert (out1 / "summary.json").read_bytes() != (out2 / "summary.json").read_bytes()


def test_replay_runs_one_configuration(tmp_path):
    out = tmp_path / "r"
    args = [
        "replay",
        "--policy",
        "round_robin",
        "--cache",
        "off",
        "--duration-s",
        "20",
        "--out",
        str(out),
        "--db",
        str(tmp_path / "log.duckdb"),
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["configs"]) == ["round_robin_nocache"]
    assert summary["configs"]["round_robin_nocache"]["max_worker_share"] == pytest.approx(0.25, abs=0.02)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["experiment", "--rate-scale", "0"], "error: --rate-scale = 0.0, expected a finite number > 0"),
        (["experiment", "--duration-s", "0"], "error: --duration-s = 0.0"),
        (["experiment", "--fleet", "a100:2,tpu:1"], "fleet GPU 'tpu'"),
        (["experiment", "--slowdown", "x"], "slowdown 'x'"),
        (["experiment", "--trace", "nope.parquet"], "nope.parquet"),
        (["replay", "--policy", "magic"], "--policy = 'magic'"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, args, message):
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "o"), "--db", str(tmp_path / "d.duckdb")])
    assert result.exit_code == 2
    assert message in result.output
    assert result.output.strip().startswith("error:")
    assert not (tmp_path / "d.duckdb").exists()


def _summary(tmp_path, name, *extra):
    out = tmp_path / name
    args = ["replay", "--duration-s", "20", "--out", str(out), "--db", str(tmp_path / "log.duckdb"), *extra]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads((out / "summary.json").read_text())["configs"]["cost_aware_cache"]


def test_cluster_options_reach_the_simulation(tmp_path):
    base = _summary(tmp_path, "base")
    assert _summary(tmp_path, "model", "--model", "llama-2-7b") != base
    tiny = _summary(tmp_path, "kv", "--kv-capacity-blocks", "60")
    assert tiny["rejected"] > 0  # requests longer than 60 × 512 tokens can never be admitted
    assert (tmp_path / "kv" / "report.md").exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--warmup-s", "99999", "--duration-s", "30"],
            "error: --warmup-s = 99999, expected less than the last arrival",
        ),
        (["--model", "gpt-4"], "unknown model 'gpt-4'"),
        (["--gpu-memory-utilization", "1.5"], "error: --gpu-memory-utilization = 1.5"),
    ],
)
def test_bad_cluster_options(tmp_path, extra, message):
    result = runner.invoke(app, ["replay", *extra, "--out", str(tmp_path / "o"), "--db", str(tmp_path / "d.duckdb")])
    assert result.exit_code == 2
    assert message in result.output


def test_unusable_outputs_fail_before_simulating(tmp_path):
    a_file = tmp_path / "afile"
    a_file.write_text("not a database")
    result = runner.invoke(app, ["replay", "--duration-s", "10", "--out", str(a_file), "--db", str(tmp_path / "d")])
    assert result.exit_code == 2 and "is a file, expected a folder" in result.output
    out = tmp_path / "o"
    result = runner.invoke(app, ["replay", "--duration-s", "10", "--out", str(out), "--db", str(a_file)])
    assert result.exit_code == 2 and "cannot be opened" in result.output
    assert not out.exists()  # nothing written when the log is unusable


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--prefix-caching-hash-algo", "md5"], "error: --prefix-caching-hash-algo = 'md5', expected one of"),
        (["--gpu", "tpu"], "error: --gpu = 'tpu', expected one of"),
    ],
)
def test_serve_errors_name_the_option_not_the_settings_field(tmp_path, extra, message):
    result = runner.invoke(app, ["serve", "--db", str(tmp_path / "d.duckdb"), *extra])
    assert result.exit_code == 2
    assert message in result.output


def test_workload_writes_a_mooncake_trace_that_replays(tmp_path):
    path = tmp_path / "agent.jsonl"
    result = runner.invoke(app, ["workload", "gen:agent:requests=40", str(path), "--seed", "1"])
    assert result.exit_code == 0 and "40 requests" in result.output
    assert len(path.read_text().splitlines()) == 40
    out = tmp_path / "run"
    args = ["replay", "--trace", str(path), "--policy", "least_loaded", "--out", str(out), "--db", str(tmp_path / "l")]
    assert runner.invoke(app, args).exit_code == 0
    assert json.loads((out / "physical_limit.json").read_text())["requests"] == 40
