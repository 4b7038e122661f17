"""Project tokens in the audit log (invariants 29 and 30), on Postgres and SQLite: a project
token's change is recorded with its role and its project; minting and revoking a project's
token are recorded; a role's refusal (403 role_forbidden) is recorded as refused."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.server.audit.conftest import bearer, entries
from tests.server.runs.conftest import example_config

pytestmark = pytest.mark.timeout(120)

Headers = dict[str, str]


def _project_and_token(client: TestClient, admin: Headers, role: str) -> tuple[str, Any]:
    project = client.post("/api/v1/projects", json={"name": "team-a"}, headers=admin).json()
    body = {"name": f"{role}-main", "role": role}
    made = client.post(f"/api/v1/projects/{project['id']}/tokens", json=body, headers=admin)
    assert made.status_code == 201, made.text
    return str(project["id"]), made.json()


def test_a_project_tokens_changes_carry_its_role_and_project(
    runs_app: Any, runs_client: TestClient, admin: Headers
) -> None:
    project, ci = _project_and_token(runs_client, admin, "ci")
    (minted,) = entries(runs_app, action="token.create")
    assert minted.object_id == ci["id"] and minted.role == "admin"
    created = runs_client.post("/api/v1/runs", json=example_config(), headers=bearer(ci["token"]))
    assert created.status_code == 201, created.text
    (entry,) = entries(runs_app, action="run.create")
    assert entry.role == "ci" and entry.token_name == "ci-main" and entry.outcome == "ok"
    assert str(entry.project_id) == project
    assert entry.object_id == created.json()["run"]["id"]
    revoke = f"/api/v1/projects/{project}/tokens/{ci['id']}/revoke"
    assert runs_client.post(revoke, headers=admin).status_code == 200
    (revoked,) = entries(runs_app, action="token.revoke")
    assert revoked.object_id == ci["id"] and revoked.outcome == "ok"


def test_a_roles_refusal_is_recorded_as_refused(
    runs_app: Any, runs_client: TestClient, admin: Headers
) -> None:
    _project, viewer = _project_and_token(runs_client, admin, "viewer")
    refused = runs_client.post(
        "/api/v1/runs", json=example_config(), headers=bearer(viewer["token"])
    )
    assert refused.status_code == 403 and refused.json()["code"] == "role_forbidden"
    assert entries(runs_app, action="run.create", outcome="ok") == []
    (entry,) = entries(runs_app, action="run.create")
    assert entry.outcome == "forbidden" and entry.role == "viewer"
