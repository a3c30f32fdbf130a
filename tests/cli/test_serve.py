"""``kvcost serve``: errors name the option (or environment variable), settings from ``KVCOST_*`` variables."""

from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from kvcost.cli import app

runner = CliRunner()


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


@pytest.fixture
def served(monkeypatch):
    """``uvicorn.run`` replaced: the settings ``kvcost serve`` would run with, instead of a server."""
    runs = []

    def run(api, host, port, log_level, access_log, timeout_keep_alive, loop, http):
        limits = (http.head_timeout_s, http.body_timeout_s)
        runs.append((host, port, log_level, access_log, timeout_keep_alive, loop, limits, http.max_concurrency))

    monkeypatch.setattr("uvicorn.run", run)
    return runs


def test_environment_variables_set_the_service_and_options_win(tmp_path, served):
    env = {"KVCOST_PORT": "9000", "KVCOST_DB_PATH": str(tmp_path / "env.duckdb"), "KVCOST_MLFLOW_URI": None}
    result = runner.invoke(app, ["serve", "--analytic-only"], env=env)
    assert result.exit_code == 0, result.output
    assert served == [("127.0.0.1", 9000, "info", False, 75.0, "auto", (10.0, 60.0), 2048)]
    assert f"kvcost serve on http://127.0.0.1:9000 — log {tmp_path / 'env.duckdb'}, registry none" in result.output
    options = ["--port", "9100", "--log-level", "debug", "--access-log", "--keep-alive-timeout-s", "30"]
    options += ["--head-timeout-s", "2", "--body-timeout-s", "5", "--limit-concurrency", "64"]
    result = runner.invoke(app, ["serve", "--analytic-only", *options], env=env)
    assert result.exit_code == 0, result.output
    assert served[-1] == ("127.0.0.1", 9100, "debug", True, 30.0, "auto", (2.0, 5.0), 64)


def test_the_registry_comes_from_the_option_the_variable_or_the_default(tmp_path, served):
    args = ["serve", "--db", str(tmp_path / "d.duckdb")]
    cases = [
        ([], {"KVCOST_MLFLOW_URI": None}, "registry sqlite:///runs/mlflow.db,"),
        ([], {"KVCOST_MLFLOW_URI": "sqlite:///env.db"}, "registry sqlite:///env.db,"),
        (["--mlflow-uri", "sqlite:///opt.db"], {"KVCOST_MLFLOW_URI": "sqlite:///env.db"}, "registry sqlite:///opt.db,"),
        (["--analytic-only"], {"KVCOST_MLFLOW_URI": "sqlite:///env.db"}, "registry none (analytic model),"),
    ]
    for extra, env, expected in cases:
        result = runner.invoke(app, [*args, *extra], env=env)
        assert result.exit_code == 0, result.output
        assert expected in result.output, (extra, env)


@pytest.mark.parametrize(
    ("env", "line"),
    [
        (
            {"KVCOST_PORT": "http"},
            "error: KVCOST_PORT = 'http', expected a valid integer, unable to parse string as an integer",
        ),
        ({"KVCOST_GPU_DEFAULT": "tpu"}, "error: KVCOST_GPU_DEFAULT = 'tpu', expected one of"),
        ({"KVCOST_SCRAPE_INTERVAL_S": "0"}, "error: KVCOST_SCRAPE_INTERVAL_S = '0', expected greater than 0"),
    ],
)
def test_a_bad_environment_variable_exits_2_naming_it(tmp_path, served, env, line):
    result = runner.invoke(app, ["serve", "--db", str(tmp_path / "d.duckdb")], env=env)
    assert result.exit_code == 2
    assert result.output.startswith(line) and result.output.count("\n") == 1
    assert served == []


def test_the_heavy_work_and_directory_limits_the_readme_names_are_options(tmp_path, served, monkeypatch):
    built = []
    monkeypatch.setattr(
        "kvcost.serving.api.create_app",
        lambda settings: built.append(settings) or SimpleNamespace(state=SimpleNamespace()),
    )
    limits = ["--heavy-workers", "2", "--heavy-body-bytes", "4096", "--heavy-queue-limit", "0"]
    limits += ["--max-directory-blocks-per-worker", "1024"]
    result = runner.invoke(app, ["serve", "--analytic-only", "--db", str(tmp_path / "d.duckdb"), *limits])
    assert result.exit_code == 0, result.output
    s = built[0]
    assert (s.heavy_workers, s.heavy_body_bytes, s.heavy_queue_limit, s.max_directory_blocks_per_worker) == (
        2,
        4096,
        0,
        1024,
    )
    result = runner.invoke(app, ["serve", "--analytic-only", "--heavy-workers", "0"])
    assert result.exit_code == 2 and "--heavy-workers" in result.output
