"""Tests for kvcost.cli.options: pydantic fields → typer options (default, help, type, range, validation, env)."""

import inspect
import re
from pathlib import Path
from typing import Annotated, get_args

import pytest
import typer
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from typer.testing import CliRunner

from kvcost.cli.options import SettingsTable, help_text, with_settings

runner = CliRunner()


class Demo(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    workers: int = Field(4, ge=1, le=64, description="number of workers")
    rate_s: float = Field(0.5, gt=0, description="σ of the arrival spread")
    name: str = Field("abc", max_length=3, description="vLLM name")
    tags: list[str] = Field(default_factory=list, description="a tag; repeatable")
    out: Path | None = None
    on: bool = Field(False, description="switch it on.")


class EnvDemo(BaseSettings):
    model_config = SettingsConfigDict(frozen=True, extra="forbid", env_prefix="KVTEST_")

    port: int = Field(8000, ge=0, le=65535, description="TCP port")
    gpu_default: str = Field("a100", description="GPU type of a snapshot that names none")
    hosts: list[str] = Field(default_factory=list)
    db_path: Path = Field(description="required: no default")

    @model_validator(mode="after")
    def _check(self):
        if self.gpu_default not in ("a100", "h100"):
            raise ValueError(f"gpu_default = {self.gpu_default!r}, expected one of a100, h100")
        return self


DEMO = SettingsTable(Demo)
ENV = SettingsTable(EnvDemo, include=("port", "gpu_default", "hosts", "db_path"), renames={"gpu_default": "gpu"})


def _app(table, **decorator) -> typer.Typer:
    """An app whose one command prints the settings object it was given (plain help, as ``kvcost``'s)."""
    app = typer.Typer(rich_markup_mode=None)

    @app.command()
    @with_settings(table, **decorator)
    def show(settings, verbose: Annotated[bool, typer.Option(help="Say more.")] = False) -> None:
        built = settings() if decorator.get("lazy") else settings
        print(repr(built), verbose)

    @app.command()
    def other() -> None:  # a second command, so that `show` is a subcommand as in kvcost
        pass

    return app


def test_each_field_becomes_a_keyword_option_with_its_default_type_help_and_range():
    params = {p.name: p for p in DEMO.parameters()}
    assert list(params) == ["workers", "rate_s", "name", "tags", "out", "on"]
    assert {p.kind for p in params.values()} == {inspect.Parameter.KEYWORD_ONLY}
    workers_type, workers_option = get_args(params["workers"].annotation)
    assert (workers_type, params["workers"].default) == (int, 4)
    assert (workers_option.help, workers_option.min, workers_option.max) == ("Number of workers.", 1, 64)
    rate_type, rate_option = get_args(params["rate_s"].annotation)
    assert (rate_type, rate_option.help, rate_option.min) == (float, "σ of the arrival spread.", None)  # gt: pydantic's
    assert get_args(params["tags"].annotation)[0] == list[str] | None and params["tags"].default is None
    assert get_args(params["out"].annotation)[1].help is None and params["out"].default is None
    assert get_args(params["on"].annotation)[1].help == "Switch it on."


class Needed(BaseModel):
    db_path: Path


def test_a_field_without_default_is_a_required_option_unless_the_environment_can_give_it():
    assert SettingsTable(Needed).parameters()[0].default is inspect.Parameter.empty
    params = {p.name: p for p in ENV.parameters()}
    assert list(params) == ["port", "gpu", "hosts", "db_path"]
    assert params["db_path"].default is None
    assert get_args(params["db_path"].annotation)[0] == Path | None
    assert ENV.flag("gpu_default") == "--gpu"
    result = runner.invoke(_app(ENV), ["show"])
    assert result.exit_code == 2
    assert result.output == "error: db_path is missing, expected --db-path or KVTEST_DB_PATH\n"


@pytest.mark.parametrize(
    ("description", "expected"),
    [
        ("number of workers", "Number of workers."),
        ("vLLM name", "vLLM name."),
        ("σ of the jitter", "σ of the jitter."),
        ("Already a sentence.", "Already a sentence."),
        ("WORKER:SPEED[@T_S] straggler", "WORKER:SPEED[@T_S] straggler."),
        (None, None),
    ],
)
def test_help_text(description, expected):
    assert help_text(description) == expected


def test_help_shows_default_range_and_help():
    result = runner.invoke(_app(DEMO), ["show", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    line = next(line for line in result.output.splitlines() if "--workers" in line)
    assert line.split() == ["--workers", "<int", "range>", "Number", "of", "workers.", "[default:", "4;", "1<=x<=64]"]


def test_options_not_given_take_the_model_defaults_and_given_ones_reach_the_object():
    result = runner.invoke(_app(DEMO), ["show"])
    assert result.exit_code == 0, result.output
    assert result.output == f"{Demo()!r} False\n"
    args = ["show", "--workers", "8", "--tags", "a", "--tags", "b", "--on", "--out", "o", "--verbose"]
    result = runner.invoke(_app(DEMO), args)
    assert result.exit_code == 0, result.output
    expected = Demo(workers=8, tags=["a", "b"], on=True, out=Path("o"))
    assert result.output == f"{expected!r} True\n"


def test_a_range_reaches_click():
    result = runner.invoke(_app(DEMO), ["show", "--workers", "0"])
    assert result.exit_code == 2
    assert "Invalid value for '--workers': Input should be greater than or equal to 1" in result.output


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--rate-s", "0"], "error: --rate-s = 0.0, expected greater than 0"),
        (["--name", "abcd"], "error: --name = 'abcd', String should have at most 3 characters"),
    ],
)
def test_a_validation_error_is_one_line_naming_the_option(args, line):
    result = runner.invoke(_app(DEMO), ["show", *args])
    assert result.exit_code == 2
    assert result.output == line + "\n"


def test_a_model_validator_error_names_the_renamed_option():
    result = runner.invoke(_app(ENV), ["show", "--db-path", "x", "--gpu", "tpu"], env={"KVTEST_GPU_DEFAULT": None})
    assert result.exit_code == 2
    assert result.output == "error: --gpu = 'tpu', expected one of a100, h100\n"


def test_an_environment_variable_sets_a_field_and_an_option_given_wins():
    result = runner.invoke(_app(ENV), ["show", "--db-path", "x"], env={"KVTEST_PORT": "9000"})
    assert result.exit_code == 0, result.output
    assert result.output == f"{EnvDemo(db_path=Path('x'), port=9000)!r} False\n"
    result = runner.invoke(_app(ENV), ["show", "--db-path", "x", "--port", "9100"], env={"KVTEST_PORT": "9000"})
    assert result.exit_code == 0, result.output
    assert "port=9100" in result.output


def test_an_environment_variable_fills_a_required_field():
    result = runner.invoke(_app(ENV), ["show"], env={"KVTEST_DB_PATH": "from-env.duckdb"})
    assert result.exit_code == 0, result.output
    assert "db_path=PosixPath('from-env.duckdb')" in result.output


@pytest.mark.parametrize(
    ("env", "line"),
    [
        (
            {"KVTEST_PORT": "abc"},
            "error: KVTEST_PORT = 'abc', expected a valid integer, unable to parse string as an integer",
        ),
        ({"KVTEST_PORT": "70000"}, "error: KVTEST_PORT = '70000', expected less than or equal to 65535"),
        ({"KVTEST_GPU_DEFAULT": "tpu"}, "error: KVTEST_GPU_DEFAULT = 'tpu', expected one of a100, h100"),
        ({"KVTEST_HOSTS": "a,b"}, """error: KVTEST_HOSTS = 'a,b', expected JSON such as ["0=tcp://10.0.0.5:5557"]"""),
    ],
)
def test_a_bad_environment_variable_is_one_line_naming_it(env, line):
    result = runner.invoke(_app(ENV), ["show", "--db-path", "x"], env=env)
    assert result.exit_code == 2
    assert result.output == line + "\n"


def test_lazy_settings_are_built_by_the_command_with_overrides():
    app = typer.Typer()

    @app.command()
    @with_settings(ENV, parameter="make", lazy=True)
    def show(make) -> None:
        print(make(gpu_default="h100").gpu_default, make().gpu_default)

    result = runner.invoke(app, ["--db-path", "x"])
    assert result.exit_code == 0, result.output
    assert result.output == "h100 a100\n"


def test_a_table_refuses_unknown_fields():
    with pytest.raises(ValueError, match="^Demo has no field nope, gone, lost$"):
        SettingsTable(Demo, include=("workers", "nope"), renames={"gone": "x"}, helps={"lost": "y"})


def test_a_family_help_replaces_the_fields_description_for_its_option_only():
    table = SettingsTable(Demo, include=("workers", "out"), helps={"out": "folder, default runs/x"})
    params = {p.name: get_args(p.annotation)[1].help for p in table.parameters()}
    assert params == {"workers": "Number of workers.", "out": "Folder, default runs/x."}


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["replay", "--seed", "-1"], "error: --seed = -1, expected greater than or equal to 0"),
        (["replay", "--workers=0"], "error: --workers = 0, expected greater than or equal to 1"),
        (["replay", "--rate-scale", "abc"], "error: --rate-scale = abc, expected a valid number, unable to parse"),
        (["models", "promote", "--workers", "x"], "error: --workers = x, expected a valid integer, unable to parse"),
        (["replay", "--cache", "maybe"], "error: --cache = maybe, expected one of 'on', 'off'"),
    ],
)
def test_a_refused_option_value_is_one_line_naming_the_option_and_value(args, line):
    from kvcost.cli import app as kvcost_app

    result = runner.invoke(kvcost_app, args)
    assert result.exit_code == 2
    assert result.output.startswith(line) and result.output.count("\n") == 1


def test_a_missing_option_keeps_clicks_message():
    from kvcost.cli import app as kvcost_app

    result = runner.invoke(kvcost_app, ["cost", "--gpu", "h100"])
    assert result.exit_code == 2
    assert result.output.endswith("Error: Missing option '--prompt-tokens'.\n")


def _command_paths(typer_app, prefix=()):
    """Every command of ``typer_app`` as its argument list (``["models", "list"]``)."""
    for command in typer_app.registered_commands:
        yield [*prefix, command.name or command.callback.__name__.replace("_", "-")]
    for group in typer_app.registered_groups:
        yield from _command_paths(group.typer_instance, (*prefix, group.name))


def test_no_commands_help_shows_rest_markup():
    # --help is click's plain text: a docstring's ``literal`` or :role:`target` would be printed as typed
    from kvcost.cli import app as kvcost_app

    paths = list(_command_paths(kvcost_app))
    assert len(paths) >= 12
    for path in paths:
        result = runner.invoke(kvcost_app, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert not re.search(r"``|:(mod|func|class|meth|data):`", result.output), (path, result.output)
