"""`--help` that reads whole in any terminal, 80 columns included: each option's names (and
type) on a line of their own, its help (default, required) wrapped below it across the panel's
width. Typer's own layout puts names, type and help side by side in one table and cuts what
does not fit with "…" (`--max-inflight-sequen…`, `ASYNCGRPO_WORKER_SERVE…`). Panels
(`rich_help_panel`), the usage line, the command's help and the subcommand list stay as Typer
shows them. `App` is a `typer.Typer` whose groups and commands print this help; every Typer
application of the CLI is one (tests/asyncgrpo/test_help_layout.py renders each at 80 columns).
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Callable, Iterable
from typing import Any

import typer
from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from typer.core import TyperCommand, TyperGroup
from typer.models import CommandFunctionType

HELP_INDENT = 4  # the help under an option's names
_OPTION = re.compile(r"(?<![\w-])--?[A-Za-z][\w-]*")
_VARIABLE = re.compile(r"\bASYNCGRPO_[A-Z0-9_]*(?:<[A-Z_]+>)?")
ARGUMENTS, OPTIONS, COMMANDS = "Arguments", "Options", "Commands"


def _paragraphs(text: str | None) -> list[str]:
    """A docstring's paragraphs, each on one line (single newlines are wrapping)."""
    cleaned = inspect.cleandoc(text or "")
    return [" ".join(p.split()) for p in cleaned.split("\n\n") if p.strip()]


def _styled(text: str, style: str = "") -> Text:
    shown = Text(text, style=style)
    shown.highlight_regex(_OPTION, "bold cyan")
    shown.highlight_regex(_VARIABLE, "yellow")
    return shown


def _parameter(param: Any, ctx: Any) -> RenderableType | None:
    """Names and type on one line, the help with its default below, indented."""
    record = param.get_help_record(ctx)
    if record is None:
        return None
    names, help_text = record
    rows: list[RenderableType] = [_styled(names)]
    if help_text.strip():
        rows.append(Padding(_styled(" ".join(help_text.split()), "dim"), (0, 0, 0, HELP_INDENT)))
    return Group(*rows)


def _panels(command: Any, ctx: Any) -> dict[str, list[RenderableType]]:
    """The shown parameters by panel: arguments first, then options, then the named panels."""
    panels: dict[str, list[RenderableType]] = {ARGUMENTS: [], OPTIONS: []}
    for param in command.get_params(ctx):
        if getattr(param, "hidden", False):
            continue
        default = ARGUMENTS if param.param_type_name == "argument" else OPTIONS
        panel = getattr(param, "rich_help_panel", None) or default
        shown = _parameter(param, ctx)
        if shown is not None:
            panels.setdefault(panel, []).append(shown)
    return {name: rows for name, rows in panels.items() if rows}


def _commands(group: TyperGroup, ctx: Any) -> Table | None:
    table = Table.grid(padding=(0, 2), expand=True)
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column(ratio=1, overflow="fold")
    for name in group.list_commands(ctx):
        sub = group.get_command(ctx, name)
        if sub is not None and not sub.hidden:
            first = (_paragraphs(sub.short_help or sub.help) or [""])[0]
            table.add_row(name, _styled(first))
    return table if table.row_count else None


def _panel(title: str, body: RenderableType) -> Panel:
    return Panel(body, title=title, title_align="left", border_style="dim")


def print_help(command: Any, ctx: Any) -> None:
    """The whole help of `command`, to standard output, as wide as the terminal (COLUMNS)."""
    width = os.environ.get("TERMINAL_WIDTH", "")  # as Typer's own help honours it
    console = Console(highlight=False, width=int(width) if width.isdigit() else None)
    console.print(Padding(Text(command.get_usage(ctx), style="bold"), 1))
    paragraphs = _paragraphs(command.help)
    if paragraphs:
        body = Group(*[_styled(p) for p in paragraphs[:1]], *_spaced(paragraphs[1:]))
        console.print(Padding(body, (0, 1, 1, 1)))
    for title, rows in _panels(command, ctx).items():
        console.print(_panel(title, Group(*rows)))
    if isinstance(command, TyperGroup) and (table := _commands(command, ctx)) is not None:
        console.print(_panel(COMMANDS, table))
    if command.epilog:
        console.print(Padding(_styled(" ".join(command.epilog.split())), 1))


def _spaced(paragraphs: Iterable[str]) -> list[RenderableType]:
    return [Padding(_styled(p, "dim"), (1, 0, 0, 0)) for p in paragraphs]


class HelpCommand(TyperCommand):
    """A Typer command whose `--help` is `print_help`'s."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        print_help(self, ctx)


class HelpGroup(TyperGroup):
    """A Typer group whose `--help` (and bare invocation) is `print_help`'s."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        print_help(self, ctx)


class App(typer.Typer):
    """`typer.Typer` with `print_help`'s help for the group and every command on it."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("cls", HelpGroup)
        super().__init__(**kwargs)

    def command(  # type: ignore[override]
        self, name: str | None = None, *, cls: type[TyperCommand] | None = None, **kwargs: Any
    ) -> Callable[[CommandFunctionType], CommandFunctionType]:
        return super().command(name, cls=cls or HelpCommand, **kwargs)
