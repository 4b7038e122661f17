"""`asyncgrpo audit list` against a real server over HTTP (docs/guides/audit.md, "CLI"): the
table, --json with the cursor, a filter, and a refused token exiting 2."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from asyncgrpo.cli import app as cli
from tests.conftest import make_settings, mint_token
from tests.harness.serve import serve_in_thread

pytestmark = pytest.mark.timeout(120)


def test_audit_list(sqlite_url: str, tmp_path: Path) -> None:
    from server.app import create_app

    application = create_app(make_settings(sqlite_url, tmp_path / "bucket"), migrate=True)
    token = mint_token(application, "admin", name="cli")
    runner = CliRunner()
    with serve_in_thread(application) as base:
        admin = {"Authorization": f"Bearer {token}"}
        for name in ("team-a", "team-b", "team-c"):
            made = httpx.post(f"{base}/api/v1/projects", json={"name": name}, headers=admin)
            assert made.status_code == 201, made.text
        common = ["--server", base, "--token", token]

        table = runner.invoke(cli, ["audit", "list", "--limit", "2", *common])
        assert table.exit_code == 0, table.output
        assert table.output.count("project.create") == 2 and "next: --cursor" in table.output
        assert "127.0.0.1" in table.output and "cli" in table.output

        first = runner.invoke(cli, ["audit", "list", "--limit", "2", "--json", *common])
        page = json.loads(first.output)
        assert len(page["entries"]) == 2 and page["next_cursor"] is not None
        rest = runner.invoke(
            cli, ["audit", "list", "--json", "--cursor", str(page["next_cursor"]), *common]
        )
        older = json.loads(rest.output)
        assert [e["detail"]["name"] for e in page["entries"] + older["entries"]] == [
            "team-c", "team-b", "team-a",
        ]  # fmt: skip

        refused = runner.invoke(
            cli, ["audit", "list", "--outcome", "unauthorized", "--json", *common]
        )
        assert json.loads(refused.output)["entries"] == []
        bad = runner.invoke(cli, ["audit", "list", "--server", base, "--token", "agr_adm_x"])
        assert bad.exit_code == 2 and "401" in bad.output
        again = runner.invoke(
            cli, ["audit", "list", "--outcome", "unauthorized", "--json", *common]
        )
        assert [e["action"] for e in json.loads(again.output)["entries"]] == ["GET /api/v1/audit"]


@pytest.mark.integration  # `asyncgrpo server` migrates its SQLite file before serving
def test_the_server_leaves_forwarded_headers_to_the_audit_log(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """uvicorn's own proxy headers would rewrite the peer address from X-Forwarded-For for
    connections from 127.0.0.1 before the app (and `audit.trusted_proxies`) sees it."""
    import os

    import uvicorn

    for name in [n for n in os.environ if n.startswith("ASYNCGRPO_")]:
        monkeypatch.delenv(name)
    served: dict[str, object] = {}
    monkeypatch.setattr(
        uvicorn, "run", lambda application, **kw: served.update(kw, app=application)
    )
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["server", "--port", "8125"])
    assert result.exit_code == 0, result.output
    served["app"].state.engine.dispose()  # type: ignore[attr-defined]
    assert served["proxy_headers"] is False


def test_the_server_hosts_token_commands_are_recorded(
    monkeypatch: pytest.MonkeyPatch, sqlite_url: str, tmp_path: Path
) -> None:
    """`asyncgrpo admin-token create | revoke` and `registration-token create` write the
    database directly, not through the API: recorded as made on the server, with no token."""
    from server.db import make_engine, make_sessionmaker
    from tests.server.audit.conftest import entries_in

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ASYNCGRPO_DATABASE_URL", sqlite_url)
    runner = CliRunner()
    made = [runner.invoke(cli, ["admin-token", "create", "--name", f"a{i}"]) for i in range(2)]
    assert all(r.exit_code == 0 for r in made), [r.output for r in made]
    assert runner.invoke(cli, ["registration-token", "create"]).exit_code == 0
    engine = make_engine(sqlite_url)
    factory = make_sessionmaker(engine)
    [first, _second, registration] = entries_in(factory)
    revoked = runner.invoke(cli, ["admin-token", "revoke", str(first.object_id)])
    assert revoked.exit_code == 0, revoked.output
    rows = entries_in(factory)
    engine.dispose()
    assert [(r.action, r.detail["kind"], r.detail["via"]) for r in rows] == [  # type: ignore[index]
        ("token.create", "admin", "asyncgrpo admin-token create"),
        ("token.create", "admin", "asyncgrpo admin-token create"),
        ("token.create", "registration", "asyncgrpo registration-token create"),
        ("token.revoke", "admin", "asyncgrpo admin-token revoke"),
    ]
    assert {(r.source, r.token_id, r.outcome) for r in rows} == {("server", None, "ok")}
    assert rows[3].object_id == first.object_id and registration.object_type == "token"
