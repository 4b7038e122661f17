"""docs/reference/cli.md: every `asyncgrpo` command and subcommand with its options, read from the
Click command tree that Typer builds (`typer.main.get_command`)."""

from __future__ import annotations

import enum
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer
import typer.main

from asyncgrpo.docs_reference.markdown import cell, code, page, table, value

HEADERS = ("Option", "Type", "Default", "Environment variable", "Help")


def _type(param: Any, ctx: Any) -> str:
    display = getattr(param, "display_type", None)  # Typer's parameters
    if callable(display):
        label = str(display(ctx)).strip("<>").removesuffix(" range")
    else:
        label = getattr(param.type, "name", str(param.type))
    low, high = getattr(param, "min", None), getattr(param, "max", None)
    if low is not None:
        label += f", ≥ {low}"
    if high is not None:
        label += f", ≤ {high}"
    return cell(label)


def _flags(param: Any) -> str:
    if param.param_type_name == "argument":
        return code(param.name.upper()) + " (argument)"
    flags = ", ".join(code(o) for o in param.opts)
    if param.secondary_opts:
        flags += " / " + ", ".join(code(o) for o in param.secondary_opts)
    return flags


def _plain(default: Any) -> Any:
    if isinstance(default, enum.Enum):
        return default.value
    if isinstance(default, tuple | list):
        return [_plain(d) for d in default]
    return str(default) if isinstance(default, Path) else default


def _default(param: Any) -> str:
    shown = getattr(param, "show_default", None)
    if param.required:
        return "required"
    if isinstance(shown, str):
        return code(shown)
    if shown is False:
        return "—"
    default = _plain(param.default)
    label = code("None") if default is None else value(default)
    home = str(Path.home())
    if home != "/" and home in label:
        raise ValueError(f"{param.name}: the default {label} depends on the machine")
    return label


def _envvar(param: Any) -> str:
    names = param.envvar if isinstance(param.envvar, list | tuple) else [param.envvar]
    return ", ".join(code(n) for n in names if n) or "—"


def param_row(param: Any, ctx: Any) -> tuple[str, ...]:
    return (
        _flags(param),
        _type(param, ctx),
        _default(param),
        _envvar(param),
        cell(param.help) or "—",
    )


def _paragraphs(text: str | None) -> str:
    return "\n\n".join(cell(p) for p in (text or "").strip().split("\n\n") if p.strip())


def command_sections(command: Any, path: list[str]) -> Iterator[str]:
    """The command's section (`## asyncgrpo db upgrade`), then its subcommands', sorted."""
    ctx = typer.Context(command)
    params = [p for p in command.params if not getattr(p, "hidden", False)]
    subcommands = getattr(command, "commands", {})
    yield f"## {code(' '.join(path))}\n\n{_paragraphs(command.help)}\n"
    yield f"Usage: {code(_usage(command, path, subcommands))}\n"
    if params:
        yield table(HEADERS, [param_row(p, ctx) for p in params])
    if subcommands:
        listed = ", ".join(code(" ".join([*path, n])) for n in sorted(subcommands))
        yield f"Subcommands: {listed}.\n"
    for sub in sorted(subcommands):
        if not getattr(subcommands[sub], "hidden", False):
            yield from command_sections(subcommands[sub], [*path, sub])


def _usage(command: Any, path: list[str], subcommands: dict[str, Any]) -> str:
    arguments = [p for p in command.params if p.param_type_name == "argument"]
    words = [*path, "[OPTIONS]"]
    words += [p.name.upper() if p.required else f"[{p.name.upper()}]" for p in arguments]
    return " ".join(words + (["COMMAND"] if subcommands else []))


INTRO = """
Every command of `asyncgrpo`, read from its Typer application (`asyncgrpo/cli.py`). `asyncgrpo
COMMAND --help` prints the same. The options of `asyncgrpo worker` and `asyncgrpo learner` are
their settings, each also an environment variable: see [the settings reference](settings.md).
"""


def render_app(app: typer.Typer, name: str = "asyncgrpo") -> list[str]:
    return list(command_sections(typer.main.get_command(app), [name]))


def render() -> str:
    from asyncgrpo.cli import app

    return page("Command line", INTRO, render_app(app))
