"""Command-line options derived from a pydantic-settings model, so that each option is declared
once, as the setting's field: every field (and every field of a nested settings group such as the
worker's `vllm`) is an option named after the field's environment names under the model's
prefix (ASYNCGRPO_WORKER_SERVER and …_SERVER_URL give --server and --server-url), with the
field's description as help and its default shown; a field marked `json_schema_extra={"argument":
True}` is a positional argument instead (`asyncgrpo local RUN_FILE`). Only the options given on
the command line reach the model, as init values, which win over the environment; the model
parses and checks both."""

from __future__ import annotations

import enum
import inspect
import types
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, NoReturn, TypeVar, Union, get_args, get_origin

import typer
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from protocol.settings_env import env_prefix, field_variables

S = TypeVar("S", bound=BaseSettings)


class SettingsInputError(Exception):
    """The command line or the environment holds a value the settings refuse (one line)."""


@dataclass(frozen=True)
class _Option:
    """One field as one option. `group`: the nested settings field it belongs to, if any."""

    group: str | None
    name: str
    field: FieldInfo
    flags: tuple[str, ...]
    panel: str | None

    @property
    def parameter(self) -> str:
        return f"{self.group}__{self.name}" if self.group else self.name


def settings_command(
    settings: type[S],
    on_error: Callable[[str], NoReturn],
    also: type[BaseSettings] | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate `run(settings)` into a Typer command whose options are the settings' fields;
    the command's name and help are `run`'s. With `also`, a second model's fields are options
    too (a command's own, beside the settings it shares with another command) and `run` gets
    both: `run(settings, also_settings)`. A refused value goes to `on_error` (one line)."""
    options = _options(settings)
    # a panel of their own in --help, named by the model's first docstring line
    own = [replace(o, panel=_title(also)) for o in _options(also)] if also is not None else []
    clash = {o.parameter for o in options} & {o.parameter for o in own}
    assert not clash, f"options of both models: {clash}"

    def decorate(run: Callable[..., Any]) -> Callable[..., Any]:
        def command(ctx: typer.Context, **values: Any) -> Any:
            given = {name: value for name, value in values.items() if _on_command_line(ctx, name)}
            mine = {o.parameter for o in own}
            try:
                parsed = from_command_line(
                    settings, {k: v for k, v in given.items() if k not in mine}
                )
                extra = None
                if also is not None:
                    extra = from_command_line(also, {k: v for k, v in given.items() if k in mine})
            except SettingsInputError as exc:
                on_error(str(exc))
            return run(parsed) if also is None else run(parsed, extra)

        parameters = [
            inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)
        ]
        parameters += [_parameter(o) for o in (*options, *own)]
        command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        command.__name__ = run.__name__
        command.__doc__ = run.__doc__
        return command

    return decorate


def _title(model: type[BaseSettings]) -> str:
    return (model.__doc__ or model.__name__).strip().splitlines()[0].rstrip(".")


def _on_command_line(ctx: typer.Context, parameter: str) -> bool:
    # by name: Typer ships its own copy of click, whose ParameterSource is not click's
    source = ctx.get_parameter_source(parameter)
    return source is not None and source.name == "COMMANDLINE"


def from_command_line(settings: type[S], given: dict[str, Any]) -> S:
    """The settings from the options given, by parameter name (`vllm__max_model_len` for a
    group's field), over the environment; SettingsInputError names each refused value."""
    top: dict[str, Any] = {}
    groups: dict[str, dict[str, Any]] = {}
    for parameter, value in given.items():
        group, _, name = parameter.rpartition("__")
        if group:
            groups.setdefault(group, {})[name] = _plain(value)
        else:
            top[name] = _plain(value)
    for group, values in groups.items():
        # built here, not passed as a dict: the group's own environment variables still apply
        # to the fields not given (a dict would be validated without reading them)
        group_settings = settings.model_fields[group].annotation
        assert isinstance(group_settings, type)
        top[group] = _build(group_settings, values, loc=(group,))
    return _build(settings, top, loc=())


def describe(exc: ValidationError, loc: tuple[str, ...] = (), settings: Any = None) -> str:
    """A validation error as one line: `field: reason; …`; a missing field of `settings` names
    its option and its environment variables."""
    parts = []
    for error in exc.errors():
        where = ".".join(map(str, (*loc, *error["loc"])))
        reason = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "missing" and settings is not None and error["loc"]:
            reason += _where_to_give(settings, str(error["loc"][0]))
        parts.append(f"{where}: {reason}" if where else reason)
    return "; ".join(parts)


def _where_to_give(settings: type[BaseSettings], name: str) -> str:
    prefix = env_prefix(settings)
    for field_name, field in settings.model_fields.items():
        variables = field_variables(settings, field_name, field)
        if name in (field_name, *(v.lower() for v in variables)):
            flags = _flags(settings, field_name, field, prefix)
            options = [f.split("/")[0] for f in flags]
            named = [v for v in variables if v.startswith(prefix)]
            return f" (give {' or '.join(options)}, or set {' or '.join(named)})"
    return ""


def _build(settings: type[Any], values: dict[str, Any], *, loc: tuple[str, ...]) -> Any:
    try:
        return settings(**values)
    except ValidationError as exc:
        raise SettingsInputError(describe(exc, loc, settings)) from None


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def _options(settings: type[BaseSettings]) -> list[_Option]:
    prefix = env_prefix(settings)
    options = []
    for name, field in settings.model_fields.items():
        group = field.annotation
        if isinstance(group, type) and issubclass(group, BaseModel):
            assert issubclass(group, BaseSettings), f"{name}: nested groups are settings"
            for sub, sub_field in group.model_fields.items():
                flags = _flags(group, sub, sub_field, prefix)
                panel = (field.description or name).rstrip(".")
                options.append(_Option(name, sub, sub_field, flags, panel))
        else:
            flags = _flags(settings, name, field, prefix)
            if _is_argument(field):
                options.append(_Option(None, name, field, (), None))
            elif flags:  # a field with no name under the prefix is left to the environment
                options.append(_Option(None, name, field, flags, None))
    return options


def _flags(owner: type[BaseSettings], name: str, field: FieldInfo, prefix: str) -> tuple[str, ...]:
    """`--server` for ASYNCGRPO_WORKER_SERVER: one flag per environment name under the root
    prefix, the shortest first."""
    names = [v[len(prefix) :] for v in field_variables(owner, name, field) if v.startswith(prefix)]
    flags = sorted({"--" + n.lower().replace("_", "-") for n in names}, key=lambda f: (len(f), f))
    if _value_type(field.annotation) is bool:
        return tuple(f"{f}/--no-{f[2:]}" for f in flags)
    return tuple(flags)


def _is_argument(field: FieldInfo) -> bool:
    extra = field.json_schema_extra
    return isinstance(extra, dict) and extra.get("argument") is True


def _argument(option: _Option) -> inspect.Parameter:
    """A required positional argument (its value is checked by the settings)."""
    field = option.field
    assert field.is_required(), f"{option.name}: a positional argument is required"
    info = typer.Argument(
        ..., help=field.description or "", show_default=False, metavar=option.name.upper()
    )
    annotation = _value_type(field.annotation)
    return inspect.Parameter(
        option.parameter, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=annotation
    )


def _parameter(option: _Option) -> inspect.Parameter:
    if not option.flags:
        return _argument(option)
    field = option.field
    annotation = _value_type(field.annotation)
    required = field.is_required()
    default = None if required else field.get_default(call_default_factory=True)
    show_default: bool | str = True
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    if required:
        show_default = False
    elif isinstance(extra.get("shown_default"), str):  # computed from other settings
        show_default = str(extra["shown_default"])
    elif default is None:
        show_default = "None"
    elif isinstance(default, list) and not default:
        show_default = "empty"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum) and default is not None:
        default = annotation(default)
    info = typer.Option(
        default,
        *option.flags,
        help=(field.description or "")
        + (" Required, here or in the environment." if required else ""),
        show_default=show_default,
        rich_help_panel=option.panel,
    )
    return inspect.Parameter(
        option.parameter, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=annotation
    )


def _value_type(annotation: Any) -> Any:
    """What Typer parses the option as; the settings check the value itself (ranges, paths…)."""
    if get_origin(annotation) in (Union, types.UnionType):
        (annotation,) = [a for a in get_args(annotation) if a is not type(None)]
    if get_origin(annotation) is Literal:
        values = [str(v) for v in get_args(annotation)]
        return enum.Enum("Choice", {v: v for v in values}, type=str)  # Typer: a click.Choice
    if get_origin(annotation) is list:
        return list[str]
    if annotation in (bool, int, float, Path):
        return annotation
    return str
