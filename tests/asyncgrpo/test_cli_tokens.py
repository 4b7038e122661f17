"""`asyncgrpo admin-token list/revoke`, `registration-token create/revoke`, and `server --port`
setting the public URL signed URLs point at (issues 17, 49)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import typer
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from tests.asyncgrpo.test_cli import _run
from tests.conftest import make_settings

# integration: runs the CLI as a subprocess on SQLite files
pytestmark = pytest.mark.integration


def _ids(out: str) -> list[str]:
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def test_admin_tokens_are_listed_and_revoked_with_a_last_token_guard(tmp_path: Path) -> None:
    first = _run(["admin-token", "create", "--name", "one"], tmp_path)
    second = _run(["admin-token", "create", "--name", "two"], tmp_path)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    listed = _run(["admin-token", "list"], tmp_path)
    ids = _ids(listed.stdout)
    assert len(ids) == 2 and "live" in listed.stdout
    assert _run(["admin-token", "revoke", ids[0]], tmp_path).returncode == 0
    refused = _run(["admin-token", "revoke", ids[1]], tmp_path)
    assert refused.returncode == 2 and "last live admin token" in refused.stderr
    forced = _run(["admin-token", "revoke", ids[1], "--force"], tmp_path)
    assert forced.returncode == 0 and "revoked admin token" in forced.stdout
    assert _run(["admin-token", "list"], tmp_path).stdout.count("revoked") == 2


def test_registration_token_revoke_names_a_missing_or_malformed_id(tmp_path: Path) -> None:
    missing = _run(["registration-token", "revoke", str(uuid.uuid4())], tmp_path)
    assert missing.returncode == 2 and "no registration token" in missing.stderr
    malformed = _run(["registration-token", "revoke", "nope"], tmp_path)
    assert malformed.returncode == 2 and "not a token id" in malformed.stderr


@pytest.mark.timeout(120)
def test_registration_token_create_prints_it_once_and_a_worker_registers_with_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The CLI's token is the API's: the JSON answer of POST /api/v1/registration-tokens, its
    uses and lifetime applied; it registers `--max-uses` workers on the server, then 401."""
    from asyncgrpo.cli import app

    args = ["registration-token", "create", "--name", "ci", "--max-uses", "2", "--ttl-hours", "1.5"]
    created = _run([*args, "--json"], tmp_path)
    assert created.returncode == 0, created.stderr
    answer = json.loads(created.stdout)
    assert set(answer) == {"id", "token", "prefix", "expires_at", "max_uses", "project_id"}
    assert answer["project_id"] is None  # shared: its workers serve every project
    assert answer["prefix"].startswith("agr_reg_") and answer["token"].startswith(answer["prefix"])
    expires = datetime.fromisoformat(answer["expires_at"])
    expires = expires if expires.tzinfo else expires.replace(tzinfo=UTC)
    assert abs(expires - datetime.now(UTC) - timedelta(hours=1.5)) < timedelta(minutes=10)
    assert answer["max_uses"] == 2

    monkeypatch.chdir(tmp_path)
    plain = CliRunner().invoke(app, ["registration-token", "create"])
    assert plain.exit_code == 0, plain.output
    assert plain.stdout.split() == [plain.stdout.strip()] and plain.stdout.startswith("agr_reg_")
    assert "shown only now" in plain.stderr and "up to 1 worker" in plain.stderr
    listed = CliRunner().invoke(app, ["registration-token", "list"])
    assert answer["id"] in listed.stdout and " ci" in listed.stdout

    from server.app import create_app

    database = f"sqlite:///{tmp_path / 'asyncgrpo.db'}"
    application = create_app(make_settings(database, tmp_path / "bucket"), migrate=True)
    headers = {"Authorization": f"Bearer {answer['token']}"}
    with TestClient(application) as client:
        answers = [
            client.post("/api/v1/workers/register", json={"name": f"w{i}"}, headers=headers)
            for i in range(3)
        ]
    assert [a.status_code for a in answers] == [201, 201, 401], answers[-1].text
    assert answers[2].json()["code"] == "registration_token_exhausted"


@pytest.mark.timeout(120)
def test_registration_token_create_takes_a_project(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """--project names the project (name or id) whose runs its workers serve; an unknown one
    exits 2 naming the option, and no token is made."""
    from asyncgrpo.cli import app
    from server.models.project import DEFAULT_PROJECT_ID

    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    created = runner.invoke(app, ["registration-token", "create", "--project", "default", "--json"])
    assert created.exit_code == 0, created.output
    assert json.loads(created.stdout)["project_id"] == str(DEFAULT_PROJECT_ID)
    unknown = runner.invoke(app, ["registration-token", "create", "--project", "team-x"])
    assert unknown.exit_code == 2, unknown.output
    assert "--project: project team-x not found" in unknown.output
    listed = runner.invoke(app, ["registration-token", "list"]).stdout.splitlines()
    assert len(listed) == 1 and listed[0].endswith("project default")


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--max-uses", "0"], "--max-uses: Input should be greater than or equal to 1"),
        (["--ttl-hours", "nan"], "--ttl-hours: Input should be a finite number"),
        (["--ttl-hours", "0"], "--ttl-hours: Input should be greater than 0"),
        (["--ttl-hours", "9000"], "--ttl-hours: Input should be less than or equal to 8760"),
        (["--name", "n" * 201], "--name: String should have at most 200 characters"),
    ],
)
def test_registration_token_create_refuses_what_the_api_refuses(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, args: list[str], reason: str
) -> None:
    from asyncgrpo.cli import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["registration-token", "create", *args])
    assert result.exit_code == 2 and reason in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert not (tmp_path / "asyncgrpo.db").exists()  # refused before any database


def test_registration_token_create_defaults_are_the_api_bodys() -> None:
    from asyncgrpo.cli import app
    from server.tokens.schemas import RegistrationTokenCreate

    group: Any = typer.main.get_command(app)
    command = group.commands["registration-token"].commands["create"]
    fields = RegistrationTokenCreate.model_fields
    assert {p.name: p.default for p in command.params if p.name in fields} == {
        name: field.default for name, field in fields.items()
    }


def _served_public_url(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *args: str) -> Any:
    import uvicorn

    from asyncgrpo.cli import app

    served: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn, "run", lambda application, **kw: served.update(app=application))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["server", *args])
    assert result.exit_code == 0, result.output
    application = served["app"]
    application.state.engine.dispose()
    return application.state.settings.public_url


def test_server_port_sets_the_public_url(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import os

    for name in [n for n in os.environ if n.startswith("ASYNCGRPO_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("ASYNCGRPO_PUBLIC_URL", "placeholder")
    monkeypatch.delenv("ASYNCGRPO_PUBLIC_URL")  # restored to absent after the test
    url = _served_public_url(monkeypatch, tmp_path, "--port", "8123")
    assert url == "http://127.0.0.1:8123"
    assert os.environ["ASYNCGRPO_PUBLIC_URL"] == url  # for --workers processes
    monkeypatch.setenv("ASYNCGRPO_PUBLIC_URL", "https://grpo.example.com")
    url = _served_public_url(monkeypatch, tmp_path, "--host", "0.0.0.0", "--port", "8124")
    assert url == "https://grpo.example.com"


UNUSABLE = [
    ("postgresql+psycopg://nobody@127.0.0.1:1/none", "cannot use the database: connection failed"),
    ("nodriver://somewhere/db", "is not a usable database URL"),
]
TOKEN_COMMANDS = [
    ["admin-token", "create"],
    ["registration-token", "create"],
    ["admin-token", "list"],
    ["registration-token", "list"],
    ["admin-token", "revoke", "8c0d7b3e-8a8f-4d2b-9c1e-0a0b0c0d0e0f"],
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("url", "reason"), UNUSABLE)
@pytest.mark.parametrize("command", TOKEN_COMMANDS, ids=" ".join)
def test_token_commands_on_an_unusable_database_exit_2_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, url: str, reason: str, command: list[str]
) -> None:
    from asyncgrpo.cli import app

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ASYNCGRPO_DATABASE_URL", url)
    monkeypatch.setenv("ASYNCGRPO_SECURITY__SECRET_KEY", "k" * 40)
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 2, result.output
    assert reason in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", TOKEN_COMMANDS, ids=" ".join)
def test_token_commands_on_a_newer_releases_sqlite_database_exit_2(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, command: list[str]
) -> None:
    """The embedded database migrated by a newer release (a revision this code does not know):
    the upgrade cannot run, which is a reason, not a traceback."""
    from sqlalchemy import text

    from asyncgrpo.cli import app
    from server.db import make_engine
    from server.migrate import upgrade

    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'newer.db'}"
    engine = make_engine(url)
    upgrade(engine)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'f00dfeedbeef'"))
    engine.dispose()
    monkeypatch.setenv("ASYNCGRPO_DATABASE_URL", url)
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 2, (result.output, result.exception)
    assert "f00dfeedbeef" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
