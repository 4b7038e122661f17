"""Workers declare the environments they can run at registration; admins mark workers trusted
(POST /api/v1/workers/{id}/trust, /untrust), shown in the list and on the workers page."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import make_settings, mint_token

REGISTER = "/api/v1/workers/register"


@pytest.fixture
def settings(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    """On both databases."""
    return make_settings(db_url, tmp_path / "bucket")


def _register(client, app, **body):  # type: ignore[no-untyped-def]
    reg = mint_token(app, "registration", max_uses=1)
    resp = client.post(
        REGISTER, json={"name": "w", **body}, headers={"Authorization": f"Bearer {reg}"}
    )
    return resp


def _listed(client, admin_headers, worker_id):  # type: ignore[no-untyped-def]
    workers = client.get("/api/v1/workers", headers=admin_headers).json()
    return next(w for w in workers if w["id"] == worker_id)


def test_declared_environments_and_the_old_default(client, app, admin_headers):
    declared = ["single_turn", "tool_calls", "guess_number", "my_envs:*", "my-entry.point"]
    new = _register(client, app, environments=declared)
    assert new.status_code == 201, new.text
    old = _register(client, app)  # a worker from before environments: single_turn only
    assert _listed(client, admin_headers, new.json()["id"])["environments"] == declared
    listed = _listed(client, admin_headers, old.json()["id"])
    assert listed["environments"] == ["single_turn"] and listed["trusted"] is False


def test_malformed_declarations_are_422_naming_the_field(client, app):
    for bad in (["rm -rf /"], [""], ["x"] * 65, "single_turn"):
        resp = _register(client, app, environments=bad)
        assert resp.status_code == 422, (bad, resp.text)
        assert {e["field"].split(".")[0] for e in resp.json()["errors"]} == {"environments"}


def test_trust_and_untrust(client, app, admin_headers):
    worker_id = _register(client, app).json()["id"]
    trusted = client.post(f"/api/v1/workers/{worker_id}/trust", headers=admin_headers)
    assert trusted.status_code == 200 and trusted.json()["trusted"] is True
    assert _listed(client, admin_headers, worker_id)["trusted"] is True
    untrusted = client.post(f"/api/v1/workers/{worker_id}/untrust", headers=admin_headers)
    assert untrusted.status_code == 200 and untrusted.json()["trusted"] is False
    unknown = "00000000-0000-0000-0000-000000000000"
    assert client.post(f"/api/v1/workers/{unknown}/trust", headers=admin_headers).status_code == 404


def test_only_an_admin_trusts(client, app):
    resp = _register(client, app)
    worker_id, token = resp.json()["id"], resp.json()["token"]
    answer = client.post(
        f"/api/v1/workers/{worker_id}/trust", headers={"Authorization": f"Bearer {token}"}
    )
    assert answer.status_code in (401, 403)
    assert client.post(f"/api/v1/workers/{worker_id}/trust").status_code == 401


def test_workers_page_and_run_page_show_environments(client, app, admin_token):  # type: ignore[no-untyped-def]
    import json
    import re

    from tests.server.dashboard.test_pages import login

    csrf = login(client, admin_token)
    config = json.loads((Path(__file__).parents[3] / "examples/runs/arithmetic.json").read_text())
    config["environment"] = {"name": "tool_calls", "tools": ["calculator"]}
    admin = {"Authorization": f"Bearer {admin_token}"}
    run_id = client.post("/api/v1/runs", json=config, headers=admin).json()["run"]["id"]
    model = config["base_model"]
    plain = _register(client, app, name="plain", models=[model]).json()["id"]
    _register(client, app, name="agent", models=[model], environments=["tool_calls"])

    page = client.get(f"/runs/{run_id}").text
    line = re.search(r'id="run-environment" data-able-workers="(\d+)">([^<]*<code>[^<]+)', page)
    assert line and line.group(1) == "1" and "tool_calls" in line.group(2)
    assert "1 of 2 online worker(s)" in page

    hx = {"HX-Request": "true", "X-CSRF-Token": csrf}
    table = client.post(f"/workers/{plain}/trust", headers=hx)
    assert table.status_code == 200
    row = re.search(r'<tr data-worker="plain">.*?</tr>', table.text, re.S)
    assert row and 'data-worker-trusted="true"' in row.group(0)
    assert "<code>single_turn</code>" in row.group(0) and "Untrust" in row.group(0)
    assert client.post(f"/workers/{plain}/trust").status_code == 403  # no CSRF token
