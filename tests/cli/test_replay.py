"""``kvcost replay``: one configuration; the cluster options reach the simulation."""

import json

import pytest
from typer.testing import CliRunner

from kvcost.cli import app
from kvcost.routing.policies import ROUTER_POLICIES

runner = CliRunner()


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


def _summary(tmp_path, name, *extra):
    out = tmp_path / name
    args = ["replay", "--duration-s", "20", *extra, "--out", str(out), "--db", str(tmp_path / "log.duckdb")]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads((out / "summary.json").read_text())["configs"]["cost_aware_cache"]


def test_cluster_options_reach_the_simulation(tmp_path):
    base = _summary(tmp_path, "base")
    assert _summary(tmp_path, "model", "--model", "llama-2-7b") != base
    tiny = _summary(tmp_path, "kv", "--kv-capacity-blocks", "60")
    assert tiny["rejected"] > 0  # requests longer than 60 × 512 tokens can never be admitted
    assert (
        "in-flight prefixes counted: yes; queued work net of the reuse expected to survive: yes; hot-spot skew "
        "limit: off" in (tmp_path / "kv" / "report.md").read_text()
    )


def test_the_reports_set_up_names_the_routers_toggles(tmp_path):
    off = ["--no-count-in-flight", "--no-count-promise-survival", "--max-share-over-mean", "0.5"]
    _summary(tmp_path, "off", *off, "--policy-param", "duplicate_price_weight=0", "--policy-param", "hold_tokens=64")
    report = (tmp_path / "off" / "report.md").read_text()
    assert (
        "- router (cost-aware arms): in-flight prefixes counted: no; queued work net of the reuse expected to "
        "survive: no; hot-spot skew limit: 0.5 over the mean share; policy parameters: duplicate_price_weight=0, "
        "hold_tokens=64\n" in report
    )


def test_the_workers_evict_by_the_asked_policy(tmp_path):
    # 66 requests of gen:multi-turn in 20 blocks (512 tokens each) per worker: the order of eviction matters
    small = ["--trace", "gen:multi-turn", "--duration-s", "30", "--kv-capacity-blocks", "20"]
    lru = _summary(tmp_path, "lru", *small)
    clairvoyant = _summary(tmp_path, "clairvoyant", *small, "--eviction-policy", "clairvoyant")
    assert (lru["completed"], clairvoyant["completed"]) == (66, 66)
    assert clairvoyant["hit_ratio"] > lru["hit_ratio"]
    assert json.loads((tmp_path / "clairvoyant" / "summary.json").read_text())["eviction_policy"] == "clairvoyant"
    report = (tmp_path / "clairvoyant" / "report.md").read_text()
    assert "eviction policy `clairvoyant`" in report and "| eviction policy | clairvoyant |" in report
    assert clairvoyant["eviction_policy"] == "clairvoyant" and lru["eviction_policy"] == "lru"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--warmup-s", "99999", "--duration-s", "30"],
            "error: --warmup-s = 99999, expected less than the last arrival",
        ),
        (["--model", "gpt-4"], "model = 'gpt-4', expected one of llama-2-70b"),
        (["--gpu-memory-utilization", "1.5"], "error: --gpu-memory-utilization = 1.5"),
        (["--policy-param", "hold_tokens"], "error: --policy-param = ['hold_tokens'], policy_param = 'hold_tokens'"),
        (
            ["--policy", "least_loaded", "--policy-param", "hold_tokens=1"],
            "error: policy_params name 'hold_tokens', expected a parameter of policy 'least_loaded': none",
        ),
        (
            ["--eviction-policy", "fifo"],
            "error: --eviction-policy = 'fifo', expected one of clairvoyant, cost_aware, flop_aware, gdsf, lfu, lhd",
        ),
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


def test_help_names_every_policy_whole_on_an_80_column_terminal():
    result = runner.invoke(app, ["replay", "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "…" not in result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80
    words = set(result.output.replace(",", " ").replace(".", " ").split())
    assert set(ROUTER_POLICIES.names()) <= words


def test_an_unknown_workload_names_the_trace_option():
    result = runner.invoke(app, ["replay", "--trace", "gen:mixx"])
    assert result.exit_code == 2
    assert result.output.startswith("error: --trace = 'gen:mixx': unknown workload 'mixx'; expected one of: agent")
