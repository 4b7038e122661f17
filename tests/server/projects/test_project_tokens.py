"""A project's API tokens on Postgres and SQLite (/api/v1/projects/{id}/tokens): an admin or
the project's owner mints one of a role (shown once), lists and revokes them; a revoked or
expired token is refused (401); a token of another project cannot be revoked through this one."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.orm import Session

from server.db_types import db_now
from server.models import Token

pytestmark = pytest.mark.timeout(120)

Headers = dict[str, str]


def _project(client: TestClient, admin: Headers, name: str) -> str:
    made = client.post("/api/v1/projects", json={"name": name}, headers=admin)
    assert made.status_code == 201, made.text
    return str(made.json()["id"])


def _mint(client: TestClient, by: Headers, project: str, role: str, **body: Any) -> Any:
    payload = {"name": f"{role}-1", "role": role, **body}
    return client.post(f"/api/v1/projects/{project}/tokens", json=payload, headers=by)


def _bearer(answer: Any) -> Headers:
    assert answer.status_code == 201, answer.text
    return {"Authorization": f"Bearer {answer.json()['token']}"}


def test_an_owner_mints_lists_and_revokes_its_projects_tokens(
    runs_client: TestClient, admin: Headers
) -> None:
    a = _project(runs_client, admin, "team-a")
    owner = _bearer(_mint(runs_client, admin, a, "owner"))
    made = _mint(runs_client, owner, a, "ci", ttl_hours=2)
    assert made.status_code == 201
    body = made.json()
    assert body["token"].startswith("agr_prj_") and body["role"] == "ci"
    assert body["project_id"] == a and body["kind"] == "project" and body["expires_at"]
    listed = runs_client.get(f"/api/v1/projects/{a}/tokens", headers=owner).json()
    assert [t["role"] for t in listed] == ["ci", "owner"]
    assert all("token" not in t for t in listed)
    ci = {"Authorization": f"Bearer {body['token']}"}
    assert runs_client.get("/api/v1/runs", headers=ci).status_code == 200
    revoked = runs_client.post(f"/api/v1/projects/{a}/tokens/{body['id']}/revoke", headers=owner)
    assert revoked.status_code == 200 and revoked.json()["revoked_at"]
    refused = runs_client.get("/api/v1/runs", headers=ci)
    assert refused.status_code == 401 and refused.json()["code"] == "token_revoked"
    again = runs_client.post(f"/api/v1/projects/{a}/tokens/{body['id']}/revoke", headers=owner)
    assert again.status_code == 200


def test_an_expired_project_token_is_refused(
    runs_client: TestClient, admin: Headers, db: Session
) -> None:
    a = _project(runs_client, admin, "team-a")
    made = _mint(runs_client, admin, a, "viewer", ttl_hours=1)
    viewer = _bearer(made)
    token_id = uuid.UUID(made.json()["id"])
    db.execute(update(Token).where(Token.id == token_id).values(expires_at=db_now()))
    db.commit()
    answer = runs_client.get("/api/v1/runs", headers=viewer)
    assert answer.status_code == 401 and answer.json()["code"] == "token_expired"


def test_a_token_of_another_project_is_not_found_here(
    runs_client: TestClient, admin: Headers
) -> None:
    a, b = _project(runs_client, admin, "team-a"), _project(runs_client, admin, "team-b")
    b_token = _mint(runs_client, admin, b, "ci").json()["id"]
    answer = runs_client.post(f"/api/v1/projects/{a}/tokens/{b_token}/revoke", headers=admin)
    assert answer.status_code == 404 and answer.json()["code"] == "token_not_found"
    listed = runs_client.get(f"/api/v1/projects/{b}/tokens", headers=admin).json()
    assert [t["revoked_at"] for t in listed] == [None]


@pytest.mark.parametrize(
    "body",
    [
        {"name": "x", "role": "admin"},
        {"name": "x", "role": "OWNER"},
        {"name": "", "role": "ci"},
        {"role": "ci"},
        {"name": "x", "role": "ci", "ttl_hours": 0},
        {"name": "x", "role": "ci", "project_id": "x"},
    ],
    ids=repr,
)
def test_bad_token_bodies_are_422_naming_the_field(
    runs_client: TestClient, admin: Headers, body: dict[str, Any]
) -> None:
    a = _project(runs_client, admin, "team-a")
    answer = runs_client.post(f"/api/v1/projects/{a}/tokens", json=body, headers=admin)
    assert answer.status_code == 422, answer.text
    assert answer.json()["code"] == "validation_failed"
    assert answer.json()["errors"][0]["field"]
    assert runs_client.get(f"/api/v1/projects/{a}/tokens", headers=admin).json() == []


def test_an_unknown_project_has_no_tokens_to_mint(runs_client: TestClient, admin: Headers) -> None:
    missing = "00000000-0000-4000-8000-000000000001"
    answer = _mint(runs_client, admin, missing, "ci")
    assert answer.status_code == 404 and answer.json()["code"] == "project_not_found"
