"""`--help` of every command and subcommand, rendered at 80 columns, shows every option name and
every environment-variable name whole (asyncgrpo/help_layout.py): no name cut with "…" or
folded across lines, no line wider than the terminal."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from asyncgrpo.cli import app
from asyncgrpo.help_layout import HelpCommand, HelpGroup

COLUMNS = 80
VARIABLE = re.compile(r"\bASYNCGRPO_[A-Z0-9_]*(?:<[A-Z_]+>)?")
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # styles, where FORCE_COLOR asks for them


def _commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        if not sub.hidden:
            yield from _commands(sub, (*path, name))


COMMANDS = dict(_commands(typer.main.get_command(app)))


def _names(command: Any) -> set[str]:
    """Every option name and environment-variable name its help shows: the options' flags, the
    variables they read, and every ASYNCGRPO_… name in its own help, its options' and (for a
    group) its subcommands' first paragraphs."""
    names: set[str] = set()
    texts = [command.help or ""]
    for param in command.get_params(command.context_class(command)):  # --help included
        if getattr(param, "hidden", False):
            continue
        if param.param_type_name == "option":
            names.update(param.opts, param.secondary_opts)
        envvar = param.envvar if isinstance(param.envvar, list | tuple) else [param.envvar]
        texts += [param.help or "", *(v for v in envvar if v)]
    for sub in getattr(command, "commands", {}).values():
        texts.append((sub.help or "").split("\n\n")[0])
    return names | {m for text in texts for m in VARIABLE.findall(text)}


def _help(*path: str) -> str:
    env = {"COLUMNS": str(COLUMNS), "TERMINAL_WIDTH": None}
    result = CliRunner().invoke(app, [*path, "--help"], env=env)
    assert result.exit_code == 0, result.output
    return ANSI.sub("", result.output)


def _whole(name: str, output: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", output) is not None


def test_the_tree_is_the_whole_cli() -> None:
    """Every group and command prints this help (a Typer app added without `App` would not)."""
    assert {("worker",), ("learner",), ("registration-token", "list"), ("plan",)} <= set(COMMANDS)
    for path, command in COMMANDS.items():
        assert isinstance(command, HelpGroup | HelpCommand), path


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", list(COMMANDS), ids=lambda p: " ".join(p) or "asyncgrpo")
def test_help_at_80_columns_shows_every_name_whole(path: tuple[str, ...]) -> None:
    command = COMMANDS[path]
    output = _help(*path)
    names = _names(command)
    assert names, path
    cut = sorted(n for n in names if not _whole(n, output))
    assert cut == [], f"{' '.join(path)} --help at {COLUMNS} columns cuts {cut}"
    wide = [line for line in output.splitlines() if len(line.rstrip()) > COLUMNS]
    assert wide == []


def test_the_worker_names_typer_cut_are_whole() -> None:
    """The names the issue found cut at 80 columns (`--max-inflight-sequen…`,
    `ASYNCGRPO_WORKER_SERVE…`) are whole, each option's names on a line of their own."""
    output = _help("worker")
    lines = [line.strip("│ ") for line in output.splitlines()]
    assert "--max-inflight-sequences <int>" in lines
    assert "--server, --server-url <str>" in lines
    assert _whole("ASYNCGRPO_WORKER_SERVER_URL", output)
