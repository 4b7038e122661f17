"""The dashboard's forms record the same entries as the API, under the admin token the session
logged in with; a refused login and a POST without its CSRF token are recorded as refusals
(docs/guides/audit.md, "What is recorded")."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import mint_token
from tests.server.audit.conftest import bearer, entries
from tests.server.dashboard.test_form_datasets import FORM
from tests.server.dashboard.test_pages import _csrf, login
from tests.server.datasets.files import QUESTIONS, parquet
from tests.server.learners.conftest import register_body

pytestmark = pytest.mark.timeout(180)


def _registered(client: TestClient, app: Any) -> tuple[str, str]:
    reg = bearer(mint_token(app, "registration", name="r", max_uses=2))
    worker = client.post("/api/v1/workers/register", json={"name": "w"}, headers=reg)
    learner = client.post("/api/v1/learners/register", json=register_body(), headers=reg)
    assert worker.status_code == learner.status_code == 201
    return worker.json()["id"], learner.json()["learner_id"]


def test_the_dashboards_forms_are_recorded(runs_client: TestClient, runs_app: Any) -> None:
    worker_id, learner_id = _registered(runs_client, runs_app)
    csrf = login(runs_client, mint_token(runs_app, "admin", name="browser"))
    files = {"dataset.file": ("q.parquet", parquet(QUESTIONS), "application/octet-stream")}
    created = runs_client.post("/runs/new", data={**FORM, "csrf_token": csrf}, files=files)
    assert created.status_code == 200, created.text
    run_id = re.search(r"/runs/([0-9a-f-]{36})", created.text).group(1)  # type: ignore[union-attr]
    form = {"csrf_token": csrf}
    for path in (
        f"/runs/{run_id}/cancel",
        f"/workers/{worker_id}/trust",
        f"/workers/{worker_id}/untrust",
        f"/workers/{worker_id}/revoke",
        f"/learners/{learner_id}/revoke",
    ):
        assert runs_client.post(path, data=form).status_code == 200, path
    minted = runs_client.post("/workers/registration-tokens", data={**form, "name": "fleet-2"})
    assert minted.status_code == 200
    [made] = entries(runs_app, action="token.create")
    reg_id = made.object_id
    assert runs_client.post(f"/tokens/registration/{reg_id}/revoke", data=form).status_code == 200
    assert runs_client.post("/sessions/revoke-all", data=form).status_code == 200

    rows = entries(runs_app, token_name="browser")
    assert [(r.action, r.object_type) for r in rows] == [
        ("dashboard.login", "dashboard_session"),
        ("dataset.upload", "dataset"),
        ("run.create", "run"),
        ("run.cancel", "run"),
        ("worker.trust", "worker"),
        ("worker.untrust", "worker"),
        ("worker.revoke", "worker"),
        ("learner.revoke", "learner"),
        ("token.create", "token"),
        ("token.revoke", "token"),
        ("dashboard.logout_everywhere", "dashboard_session"),
    ]
    assert {(r.role, r.outcome, r.source) for r in rows} == {("admin", "ok", "testclient")}
    assert rows[2].object_id == rows[3].object_id == run_id
    assert rows[3].project_id is not None  # the run's project


def test_refused_logins_and_csrf_failures_are_recorded(
    runs_client: TestClient, runs_app: Any
) -> None:
    page = runs_client.get("/login")
    worker = mint_token(runs_app, "worker", name="w-1", scope_id=None)
    for token in ("agr_adm_nope", worker):
        refused = runs_client.post("/login", data={"token": token, "csrf_token": _csrf(page.text)})
        assert refused.status_code == 401
        page = refused
    assert (
        runs_client.post("/login", data={"token": "x", "csrf_token": "forged"}).status_code == 403
    )
    login(runs_client, mint_token(runs_app, "admin", name="browser"))
    assert (
        runs_client.post("/sessions/revoke-all", data={"csrf_token": "forged"}).status_code == 403
    )
    rows = [r for r in entries(runs_app) if r.outcome != "ok"]
    assert [(r.action, r.outcome, r.detail["code"]) for r in rows] == [  # type: ignore[index]
        ("dashboard.login", "unauthorized", "token_invalid"),
        ("dashboard.login", "forbidden", "token_kind_forbidden"),
        ("dashboard.login", "forbidden", "csrf_failed"),
        ("dashboard.logout_everywhere", "forbidden", "csrf_failed"),
    ]
    assert rows[1].token_name == "w-1" and rows[1].role == "worker"
