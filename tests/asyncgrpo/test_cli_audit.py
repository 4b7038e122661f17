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
