from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# integration: runs the CLI as a subprocess
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "asyncgrpo.cli"]


def _run(args, cwd, env=None, timeout=None):  # type: ignore[no-untyped-def]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCGRPO_")}
    full_env.update(env or {})
    return subprocess.run(
        CLI + args, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout
    )


def test_help_lists_commands(tmp_path):
    out = _run(["--help"], tmp_path)
    assert out.returncode == 0
    for cmd in ("server", "db", "admin-token"):
        assert cmd in out.stdout


def test_admin_token_create_on_embedded_default(tmp_path):
    out = _run(["admin-token", "create", "--name", "ci"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith("agr_adm_")
    assert (tmp_path / "asyncgrpo.db").exists()


def test_bad_configuration_is_a_clear_error_not_a_traceback(tmp_path):
    out = _run(
        ["db", "upgrade"], tmp_path, {"ASYNCGRPO_DATABASE_URL": "postgresql+psycopg://x@h/db"}
    )
    assert out.returncode == 2
    assert "SECRET_KEY must be set" in out.stderr
    assert "Traceback" not in out.stderr


def test_worker_and_learner_entry_points_do_not_import_the_web_stack():
    code = (
        "import sys, asyncgrpo.cli, protocol.client, protocol.storage;"
        "bad = [m for m in ('fastapi', 'sqlalchemy', 'server') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_learner_reward_modules_from_options_and_environment(monkeypatch):  # type: ignore[no-untyped-def]
    """`--reward-module` (repeatable) or ASYNCGRPO_LEARNER_REWARD_MODULES (a JSON list) reach
    the learner's settings; a name that is not a module path is a clear error."""
    from typer.testing import CliRunner

    import learner.main
    from asyncgrpo.cli import app

    seen = []
    monkeypatch.setattr(learner.main, "main", lambda settings: seen.append(settings) or 0)
    base = ["learner", "--server", "http://h:8000", "--run", "r", "--token", "agr_lrn_x"]
    modules = ["--reward-module", "my_rewards", "--reward-module", "my_rewards.math"]
    runner = CliRunner()
    assert runner.invoke(app, base + modules).exit_code == 0
    assert seen[-1].reward_modules == ["my_rewards", "my_rewards.math"]
    monkeypatch.setenv("ASYNCGRPO_LEARNER_REWARD_MODULES", '["from_env"]')
    assert runner.invoke(app, base).exit_code == 0
    assert seen[-1].reward_modules == ["from_env"]
    monkeypatch.delenv("ASYNCGRPO_LEARNER_REWARD_MODULES")
    assert runner.invoke(app, base).exit_code == 0
    assert seen[-1].reward_modules == []
    bad = runner.invoke(app, [*base, "--reward-module", "os system"])
    assert bad.exit_code == 2 and "not a dotted module path" in bad.output
    assert len(seen) == 3


def test_db_upgrade_names_an_unusable_database(monkeypatch, tmp_path):  # type: ignore[no-untyped-def]
    """The migration Job's command (deploy/kubernetes/migrate-job.yaml): a database that is down,
    a URL that does not parse or names a missing driver, or an unknown revision exit 2 with the
    reason, not a traceback."""
    from typer.testing import CliRunner

    from asyncgrpo.cli import app
    from tests.conftest import TEST_SECRET

    monkeypatch.setenv("ASYNCGRPO_SECURITY__SECRET_KEY", TEST_SECRET)
    cases = [
        ("postgresql+psycopg://nobody@127.0.0.1:1/x", [], "cannot migrate the database"),
        ("not a url", [], "is not a usable database URL"),
        ("mysql://u@localhost/db", [], "is not a usable database URL"),
        (f"sqlite:///{tmp_path / 'a.db'}", ["nosuchrev"], "revision 'nosuchrev'"),
    ]
    for url, args, message in cases:
        monkeypatch.setenv("ASYNCGRPO_DATABASE_URL", url)
        result = CliRunner().invoke(app, ["db", "upgrade", *args])
        assert result.exit_code == 2, (url, result.output)
        assert message in result.output, (url, result.output)
        if result.exception is not None:
            assert isinstance(result.exception, SystemExit)
    monkeypatch.setenv("ASYNCGRPO_DATABASE_URL", f"sqlite:///{tmp_path / 'b.db'}")
    assert CliRunner().invoke(app, ["db", "upgrade"]).output.strip() == "database at head"


def _leaf_commands(group, path=()):  # type: ignore[no-untyped-def]
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            yield from _leaf_commands(command, (*path, name))
        else:
            yield (*path, name), command


def test_every_option_of_every_command_shows_its_default():
    """`--help` of each command shows each option's default, or says it is required."""
    import typer

    from asyncgrpo.cli import app

    commands = dict(_leaf_commands(typer.main.get_command(app)))
    assert {("worker",), ("learner",), ("server",), ("db", "upgrade")} <= set(commands)
    missing = []
    for path, command in commands.items():
        ctx = command.context_class(command, info_name=path[-1])
        for param in command.params:
            record = param.get_help_record(ctx)
            if param.name != "help" and record is not None:
                if "default:" not in record[1] and "required" not in record[1].lower():
                    missing.append(f"{' '.join(path)} {record[0]}")
    assert missing == []


def test_a_computed_default_is_shown_as_what_it_is_not_none():
    """The worker's name defaults to the host name (and names its state folder): `--help`
    says so in the default, not `(None)`."""
    import typer

    from asyncgrpo.cli import app

    command = dict(_leaf_commands(typer.main.get_command(app)))[("worker",)]
    ctx = command.context_class(command, info_name="worker")
    (name,) = [p for p in command.params if p.name == "name"]
    record = name.get_help_record(ctx)
    assert record is not None and "[default: (the host name)]" in record[1], record


@pytest.mark.parametrize(
    ("command", "typo", "setting"),
    [
        ("worker", "ASYNCGRPO_WORKER_SHUTDOWN_GRACE", "ASYNCGRPO_WORKER_SHUTDOWN_GRACE_S"),
        ("worker", "ASYNCGRPO_WORKER_VLLM_MAX_MODEL_LENGTH", "ASYNCGRPO_WORKER_VLLM_MAX_MODEL_LEN"),
        ("learner", "ASYNCGRPO_LEARNER_REWARD_MODUELS", "ASYNCGRPO_LEARNER_REWARD_MODULES"),
    ],
)
def test_an_unknown_variable_of_the_prefix_is_refused_with_the_closest_name(
    tmp_path, command, typo, setting
):  # type: ignore[no-untyped-def]
    """As the server does: a misspelt ASYNCGRPO_WORKER_* / ASYNCGRPO_LEARNER_* (a nested group's
    too) stops the process with one line naming it and the closest setting, not a traceback."""
    required = {
        "ASYNCGRPO_WORKER_SERVER": "http://127.0.0.1:1",
        "ASYNCGRPO_LEARNER_SERVER": "http://127.0.0.1:1",
        "ASYNCGRPO_LEARNER_RUN": "r",
        "ASYNCGRPO_LEARNER_TOKEN": "agr_lrn_x",
    }
    out = _run([command], tmp_path, {**required, typo: "1"}, timeout=120)  # before: it ran
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"{typo} is not a {command} setting ({command}/config.py)" in out.stderr
    assert f"did you mean {setting}?" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
