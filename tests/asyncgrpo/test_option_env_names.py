"""`asyncgrpo worker` and `asyncgrpo learner`: every command-line option is also an environment
variable named after it (ASYNCGRPO_WORKER_<OPTION>, ASYNCGRPO_LEARNER_<OPTION>), as the README
says, including the options whose setting has another name (--server, --threads, --run)."""

from __future__ import annotations

from typing import Any

import pytest
import typer
from pydantic import AliasChoices
from pydantic_settings import BaseSettings

from asyncgrpo.cli import app
from learner.config import LearnerSettings
from worker.config import WorkerSettings

COMMANDS = [
    ("worker", "ASYNCGRPO_WORKER_", WorkerSettings),
    ("learner", "ASYNCGRPO_LEARNER_", LearnerSettings),
]


def _env_names(settings: type[BaseSettings], prefix: str) -> set[str]:
    names = set()
    for name, field in settings.model_fields.items():
        names.add(prefix + name.upper())
        if isinstance(field.validation_alias, AliasChoices):
            names |= {c.upper() for c in field.validation_alias.choices if isinstance(c, str)}
    return names


@pytest.mark.parametrize(("command", "prefix", "settings"), COMMANDS)
def test_every_option_has_the_environment_name_of_the_readme(command, prefix, settings) -> None:  # type: ignore[no-untyped-def]
    group: Any = typer.main.get_command(app)  # typer's click group
    params = group.commands[command].params
    options = [p for p in params if p.param_type_name == "option"]
    long_names = [o for p in options for o in p.opts if o.startswith("--")]
    assert "--server" in long_names and "--threads" in long_names
    expected = {prefix + o[2:].replace("-", "_").upper() for o in long_names}
    assert expected <= _env_names(settings, prefix), expected - _env_names(settings, prefix)


def test_worker_reads_server_and_threads_under_both_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCGRPO_WORKER_SERVER", "http://by-option-name:1")
    monkeypatch.setenv("ASYNCGRPO_WORKER_THREADS", "3")
    settings = WorkerSettings()
    assert (settings.server_url, settings.num_threads) == ("http://by-option-name:1", 3)
    monkeypatch.delenv("ASYNCGRPO_WORKER_SERVER")
    monkeypatch.delenv("ASYNCGRPO_WORKER_THREADS")
    monkeypatch.setenv("ASYNCGRPO_WORKER_SERVER_URL", "http://by-field-name:2")
    monkeypatch.setenv("ASYNCGRPO_WORKER_NUM_THREADS", "5")
    settings = WorkerSettings()
    assert (settings.server_url, settings.num_threads) == ("http://by-field-name:2", 5)
    # the command line (field names) still wins over the environment
    assert WorkerSettings(server_url="http://cli:3", num_threads=7).num_threads == 7


def test_learner_reads_server_and_run_under_both_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCGRPO_LEARNER_SERVER", "http://by-option-name:1")
    monkeypatch.setenv("ASYNCGRPO_LEARNER_RUN", "run-a")
    monkeypatch.setenv("ASYNCGRPO_LEARNER_TOKEN", "agr_lrn_x")
    settings = LearnerSettings()
    assert (settings.server_url, settings.run_id) == ("http://by-option-name:1", "run-a")
    assert LearnerSettings(server_url="http://cli:2", run_id="run-b").run_id == "run-b"


def test_an_unknown_worker_variable_is_still_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    monkeypatch.setenv("ASYNCGRPO_WORKER_SERVER_URL", "http://x:1")
    with pytest.raises(ValidationError):
        WorkerSettings(server="http://no-such-init-name:1")  # type: ignore[call-arg]
