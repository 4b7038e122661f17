"""The runs tests' app on Postgres and SQLite (tests/server/runs/conftest.py), for the project
tokens' access rules, and project tokens made through the API."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from tests.server.runs.conftest import admin, db, runs_app, runs_client

__all__ = ["admin", "db", "runs_app", "runs_client", "project_token", "new_project"]

Headers = dict[str, str]


def bearer(token: str) -> Headers:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def new_project(runs_client: TestClient, admin: Headers) -> Callable[[str], str]:
    """Create a project by name (an admin's call); its id."""

    def make(name: str) -> str:
        made = runs_client.post("/api/v1/projects", json={"name": name}, headers=admin)
        assert made.status_code == 201, made.text
        return str(made.json()["id"])

    return make


@pytest.fixture
def project_token(runs_client: TestClient, admin: Headers) -> Callable[[str, str], Headers]:
    """Mint a token of a project with a role (an admin's call); its bearer headers."""

    def mint(project_id: str, role: str) -> Headers:
        body = {"name": f"{role}-token", "role": role}
        made = runs_client.post(f"/api/v1/projects/{project_id}/tokens", json=body, headers=admin)
        assert made.status_code == 201, made.text
        return bearer(made.json()["token"])

    return mint
