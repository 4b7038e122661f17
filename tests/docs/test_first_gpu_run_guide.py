"""docs/guides/first-gpu-run.md names only what exists (issue 49): every `asyncgrpo …` command
of its shell blocks is a command of the CLI and every `--option` it gives is one of that
command's options, and every `ASYNCGRPO_*` variable it sets is a server setting. Its CPU
walk-through runs in tests/e2e/test_first_gpu_run_tutorial.py; its links are checked by
tests/docs/test_citations.py and `mkdocs build --strict` (validation: anchors). Pure reading:
the CLI's click tree, no process."""

from __future__ import annotations

import re
import shlex
from typing import Any

import typer

from asyncgrpo.cli import app
from server.config import unknown_variables
from tests.docs.test_citations import ROOT

PAGE = ROOT / "docs" / "guides" / "first-gpu-run.md"
BLOCK = re.compile(r"```bash\n(.*?)```", re.S)
COMMAND = re.compile(r"(?:^[ \t]*|&&\s*|\$\(|\.venv/bin/)asyncgrpo\s+([^&|;)>#\n]*)", re.M)
VARIABLE = re.compile(r"\b(ASYNCGRPO_[A-Z0-9_]+)=")


def _commands(text: str) -> list[list[str]]:
    """The words after `asyncgrpo` of each command in the page's bash blocks: at the start of a
    line, after `&&` or `$(`, or run as `.venv/bin/asyncgrpo`, up to a redirect, a pipe or a
    comment."""
    found = []
    for block in BLOCK.findall(text):
        joined = block.replace("\\\n", " ")
        found += [shlex.split(words) for words in COMMAND.findall(joined)]
    return found


def _resolve(words: list[str]) -> tuple[Any, list[str]]:
    """The command the words name (typer's own click types: a group has `get_command`) and the
    words after it."""
    command: Any = typer.main.get_command(app)
    rest = list(words)
    while hasattr(command, "get_command") and rest and not rest[0].startswith("-"):
        sub = command.get_command(None, rest[0])
        assert sub is not None, f"asyncgrpo has no command {rest[0]!r} ({words})"
        command, rest = sub, rest[1:]
    assert not hasattr(command, "get_command"), f"{words}: a group, not a command"
    return command, rest


def _unknown_options(words: list[str]) -> set[str]:
    command, rest = _resolve(words)
    options = {opt for param in command.params for opt in param.opts + param.secondary_opts}
    return {w.split("=", 1)[0] for w in rest if w.startswith("--")} - options


def test_every_command_and_option_on_the_page_exists() -> None:
    commands = _commands(PAGE.read_text(encoding="utf-8"))
    named = {_resolve(words)[0].name for words in commands}
    assert {"local", "upgrade", "server", "jobs", "create", "learner", "worker"} <= named, named
    for words in commands:
        assert not _unknown_options(words), (words, sorted(_unknown_options(words)))


def test_every_setting_the_page_sets_is_a_server_setting() -> None:
    names = set(VARIABLE.findall(PAGE.read_text(encoding="utf-8")))
    assert {"ASYNCGRPO_DATABASE_URL", "ASYNCGRPO_BUCKET_URL", "ASYNCGRPO_S3__ENDPOINT_URL"} <= names
    assert unknown_variables(dict.fromkeys(names, "x")) == []


def test_a_misspelt_option_or_setting_is_caught() -> None:
    assert _unknown_options(["worker", "--vllm-max-lora-rnk", "32"]) == {"--vllm-max-lora-rnk"}
    assert _unknown_options(["doctor", "worker", "--run", "x", "--dtype", "bfloat16"]) == set()
    assert _commands(
        "```bash\nx=$(asyncgrpo admin-token create --name a) && asyncgrpo jobs\n```"
    ) == [["admin-token", "create", "--name", "a"], ["jobs"]]
    assert unknown_variables({"ASYNCGRPO_S3__ENDPOINT": "x"}) != []
