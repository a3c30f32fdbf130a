"""CLI options generated from pydantic settings: each field's type, default, help and range are defined once.

A :class:`SettingsTable` names a settings model (``ReplaySettings``, ``ServiceSettings``) and
which of its fields a command exposes; :func:`with_settings` turns a command's ``settings``
parameter into one typer option per field and hands the command the validated settings
object. The mapping, field → option:

* name: ``--`` + the field name with ``-`` for ``_`` (or the table's rename: ``gpu_default`` → ``--gpu``);
* type and default: the field's (an empty list default shows as none; a field without default
  is a required option, unless the model reads environment variables); ``bool`` fields are
  ``--x/--no-x`` flags, ``list[str]`` fields repeatable;
* help: the field's ``description`` (a lower-case first word capitalised, a final full stop);
* range: ``ge`` / ``le`` become click's range check (shown in ``--help``; its refusal is one line naming
  the option and the value, :class:`OneLineErrorsGroup`, exit 2);
  every other check (``gt``, ``lt``, lengths, validators) is the model's own, run when the object
  is built: its error is one line, ``error: --option = value, expected …``, exit 2.

Options a user did not give are not passed on, so a ``pydantic_settings.BaseSettings`` model
fills them from its environment variables (``KVCOST_PORT``) before its defaults; an error in
such a value names the variable.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, get_args, get_origin

import annotated_types
import typer
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsError
from typer.core import TyperGroup

from kvcost.cli.common import guard

#: Parameter through which typer hands a generated command its context.
_CONTEXT = "settings_context"
#: Example of a list field's environment variable value.
_JSON_LIST = '["0=tcp://10.0.0.5:5557"]'


@dataclass(frozen=True)
class SettingsTable:
    """The options of ``model``'s fields that one command family exposes.

    Attributes:
        model: the pydantic model; a ``BaseSettings`` also reads its environment variables.
        include: fields that become options, in this order (None: every field, in model order).
        exclude: fields left out (set through the environment or the model's default only).
        renames: field → option parameter name where the option is named otherwise
            (``{"gpu_default": "gpu"}`` gives ``--gpu``).
        helps: field → this family's help for its option, where the field's description (shared by
            every family) says more than applies here (``out``'s default folder differs by command).
    """

    model: type[BaseModel]
    include: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()
    renames: Mapping[str, str] = field(default_factory=dict)
    helps: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        named = (*(self.include or ()), *self.exclude, *self.renames, *self.helps)
        unknown = [f for f in named if f not in self.model.model_fields]
        if unknown:
            raise ValueError(f"{self.model.__name__} has no field {', '.join(unknown)}")

    def fields(self) -> tuple[str, ...]:
        """Names of the fields that become options, in option order."""
        names = self.include if self.include is not None else tuple(self.model.model_fields)
        return tuple(n for n in names if n not in self.exclude)

    def parameter(self, field_name: str) -> str:
        """Python parameter name of ``field_name``'s option (``gpu_default`` → ``gpu``)."""
        return self.renames.get(field_name, field_name)

    def flag(self, field_name: str) -> str:
        """``--`` option of ``field_name`` (``rate_scale`` → ``--rate-scale``)."""
        return "--" + self.parameter(field_name).replace("_", "-")

    def parameters(self) -> list[inspect.Parameter]:
        """One keyword-only ``Annotated[type, typer.Option(...)]`` parameter per field.

        A field without default is a required option, unless an environment variable can give it.
        """
        reads_env = issubclass(self.model, BaseSettings)
        return [
            option_parameter(
                self.parameter(n), self.model.model_fields[n], required=not reads_env, help=self.helps.get(n)
            )
            for n in self.fields()
        ]

    def build(
        self, values: Mapping[str, Any], given: Iterable[str], overrides: Mapping[str, Any] | None = None
    ) -> BaseModel:
        """The settings object of the option ``values`` (by parameter name) that the user ``given``.

        Options not given are left to the model (environment variable, then default); ``overrides``
        (by field name, any field) are passed as they are.

        Raises:
            ValueError: one line naming the option (or environment variable), the value and the expectation.
        """
        given = set(given)
        passed = {n: values[self.parameter(n)] for n in self.fields() if self.parameter(n) in given}
        passed |= overrides or {}
        try:
            return self.model(**passed)
        except ValidationError as exc:
            raise ValueError(self._reason(exc.errors()[0], passed)) from None
        except SettingsError as exc:  # an environment variable pydantic-settings could not decode (JSON lists)
            found = re.search(r'field "(\w+)"', str(exc))
            name = env_name(self.model, found.group(1)) if found else "an environment variable"
            raise ValueError(f"{name} = {env_value(name)!r}, expected JSON such as {_JSON_LIST}") from None

    def _reason(self, error: Mapping[str, Any], passed: Mapping[str, Any]) -> str:
        """One line for pydantic ``error``: the field's option or variable, the value, the expectation."""
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "missing":
            field_name = str(error["loc"][0])
            ways = [self.flag(field_name)] if field_name in self.fields() else []
            ways += [v for v in [env_name(self.model, field_name)] if v]
            return f"{field_name} is missing, expected {' or '.join(ways) or 'a value'}"
        if error["loc"]:
            where = self._source(str(error["loc"][0]), passed)
            return f"{where} = {error['input']!r}, {_expectation(message)}"
        field_name = message.split(" ", 1)[0].rstrip(":")
        if field_name not in self.model.model_fields:
            return message
        return self._source(field_name, passed) + message[len(field_name) :]

    def _source(self, field_name: str, passed: Mapping[str, Any]) -> str:
        """Where ``field_name``'s value came from: its option, its environment variable, or the field."""
        if field_name in passed and field_name in self.fields():
            return self.flag(field_name)
        variable = env_name(self.model, field_name)
        if variable is not None and env_value(variable) is not None:
            return variable
        return self.flag(field_name) if field_name in self.fields() else field_name


def with_settings(
    table: SettingsTable, parameter: str = "settings", *, lazy: bool = False
) -> Callable[[Callable], Callable]:
    """Decorator: a command's ``parameter`` (the settings object) becomes one option per field of ``table``.

    The options take ``parameter``'s place in the command's signature (and so in ``--help``);
    the command is called with the validated settings object (bad settings exit 2 with one
    line), or with ``lazy``, with a function ``make(**overrides)`` that builds it, the keyword
    ``overrides`` (by field name) counting as given options, and raises ``ValueError``.
    One table per command: the wrapper takes typer's context as parameter ``settings_context``.
    """

    def decorate(command: Callable) -> Callable:
        signature = inspect.signature(command, eval_str=True)
        own = [p for p in signature.parameters.values() if p.name != parameter]
        at = list(signature.parameters).index(parameter)
        generated = table.parameters()
        names = [p.name for p in generated]

        @functools.wraps(command)
        def run(**kwargs: Any) -> Any:
            context = kwargs.pop(_CONTEXT)
            values, given = {n: kwargs.pop(n) for n in names}, given_options(context, names)
            if lazy:
                return command(**kwargs, **{parameter: functools.partial(_build_with, table, values, given)})
            return command(**kwargs, **{parameter: guard(lambda: table.build(values, given))})

        keyword = inspect.Parameter.KEYWORD_ONLY  # any order of defaults; typer passes keywords
        parameters = [p.replace(kind=keyword) for p in (*own[:at], *generated, *own[at:])]
        parameters.append(inspect.Parameter(_CONTEXT, keyword, annotation=typer.Context))  # typer passes it
        del run.__wrapped__  # typer reads the signature below, not the command's
        run.__signature__ = inspect.Signature(parameters)
        run.__annotations__ = {p.name: p.annotation for p in parameters}
        return run

    return decorate


def _build_with(table: SettingsTable, values: Mapping[str, Any], given: set[str], **overrides: Any) -> BaseModel:
    """``table.build`` with keyword ``overrides`` (by field name)."""
    return table.build(values, given, overrides)


def given_options(context: typer.Context, names: Iterable[str]) -> set[str]:
    """The parameters among ``names`` whose value the user gave on the command line (not a default)."""
    sources = {n: context.get_parameter_source(n) for n in names}  # click's ParameterSource (typer vendors click)
    return {n for n, source in sources.items() if source is not None and source.name != "DEFAULT"}


def option_parameter(name: str, info: FieldInfo, required: bool = True, help: str | None = None) -> inspect.Parameter:
    """The typer option of one pydantic field, as a keyword-only parameter called ``name``.

    A field without default is a required option, or with ``required=False`` one whose absence
    the model reports (its value may come from elsewhere, e.g. an environment variable). Its help
    is ``help`` when given, else the field's description.
    """
    if info.is_required():
        annotation, default = info.annotation | None, None if not required else inspect.Parameter.empty
    else:
        annotation, default = info.annotation, info.get_default(call_default_factory=True)
    if default is not None and get_origin(annotation) is list and not default:
        annotation, default = annotation | None, None  # typer's repeatable option: None when not given
    option = typer.Option(help=help_text(help or info.description), **range_of(info))
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[annotation, option]
    )


def help_text(description: str | None) -> str | None:
    """A field description as option help: a lower-case first word capitalised (not ``vLLM``, ``σ``), a final
    full stop (click's plain help: no markup to escape)."""
    if not description:
        return None
    first_word = description.split(" ", 1)[0]
    text = description[0].upper() + description[1:] if first_word.isascii() and first_word.islower() else description
    return text if text.endswith(".") else text + "."


def range_of(info: FieldInfo) -> dict[str, Any]:
    """typer's ``min`` / ``max`` of a numeric field's ``ge`` / ``le`` (shown in ``--help``, checked by click).

    typer has no open bounds: ``gt`` / ``lt`` are checked by pydantic when the settings are built.
    """
    if not {int, float} & {info.annotation, *get_args(info.annotation)}:
        return {}
    bounds: dict[str, Any] = {}
    for item in info.metadata:
        if isinstance(item, annotated_types.Ge):
            bounds["min"] = item.ge
        elif isinstance(item, annotated_types.Le):
            bounds["max"] = item.le
    return bounds


def env_name(model: type[BaseModel], field_name: str) -> str | None:
    """Environment variable of ``model``'s field (``KVCOST_PORT``); None for a model that reads none."""
    if not issubclass(model, BaseSettings):
        return None
    return (model.model_config.get("env_prefix", "") + field_name).upper()


def env_value(name: str) -> str | None:
    """Value of environment variable ``name``, matched case-insensitively as pydantic-settings does."""
    return next((v for k, v in os.environ.items() if k.upper() == name), None)


def _expectation(message: str) -> str:
    """pydantic's ``Input should be …`` and click's ``'x' is not one of 'a', 'b'.`` (a choice, behind typer's
    ``Value error,``) → ``expected …``; other messages unchanged."""
    message = message.removeprefix("Value error, ")
    if message.startswith("Input should be "):
        return "expected " + message.removeprefix("Input should be ")
    choice = re.fullmatch(r"'.*' is not one of (.*?)\.?", message)
    return f"expected one of {choice.group(1)}" if choice else message


class _OneLineBadParameter(typer.BadParameter):
    """A refused option value shown as one ``error:`` line (click's shows the usage block and no value)."""

    def show(self, file: Any = None) -> None:
        typer.echo(f"error: {self.message}", file=file, err=True)


class OneLineErrorsGroup(TyperGroup):
    """The ``kvcost`` group: a bad option value is ``error: --seed = -1, expected greater than or equal to 0``.

    click (typer's copy) reports a value its type or range check refuses as ``Error: Invalid value for
    '--seed': …`` under the usage block, without the value; every other bad input in kvcost is one line
    naming the option, the value and what was expected (:func:`kvcost.cli.common.guard`). Exit status 2.
    """

    def invoke(self, ctx: typer.Context) -> Any:
        args = [*ctx._protected_args, *ctx.args]  # the command's own arguments, before click consumes them
        try:
            return super().invoke(ctx)
        except typer.BadParameter as exc:
            value = _given_value(args, exc.param.opts) if exc.param is not None else None
            if value is None:  # a missing option, or an argument: click's own message says it
                raise
            option = max(exc.param.opts, key=len)
            raise _OneLineBadParameter(f"{option} = {value}, {_expectation(exc.message)}") from None


def _given_value(args: list[str], opts: Iterable[str]) -> str | None:
    """The last value ``args`` give an option named by any of ``opts`` (``--seed -1`` or ``--seed=-1``)."""
    value = None
    for i, arg in enumerate(args):
        name, eq, attached = arg.partition("=")
        if name in opts:
            value = attached if eq else (args[i + 1] if i + 1 < len(args) else None)
    return value
