"""Registration tokens with a project, on Postgres and SQLite (docs/guides/projects.md,
"Registration tokens and the fleet"): the token names its project by name or id, a worker or
pool learner registered with it is in that project, one registered with a shared token is in
the shared fleet, and listings show it; an unknown project is a 422 that makes nothing."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.harness.batches import FP
from tests.server.runs.conftest import admin, db, runs_app, runs_client

__all__ = ["admin", "db", "runs_app", "runs_client"]

pytestmark = pytest.mark.timeout(120)

TOKENS = "/api/v1/registration-tokens"


def _project(client: TestClient, admin: dict[str, str], name: str) -> dict[str, Any]:
    made = client.post("/api/v1/projects", json={"name": name}, headers=admin)
    assert made.status_code == 201, made.text
    return dict(made.json())


def _token(client: TestClient, admin: dict[str, str], **body: Any) -> dict[str, Any]:
    made = client.post(TOKENS, json={"max_uses": 5, **body}, headers=admin)
    assert made.status_code == 201, made.text
    return dict(made.json())


def _register_worker(client: TestClient, token: str) -> dict[str, Any]:
    answer = client.post(
        "/api/v1/workers/register",
        json={"name": "w", "models": ["m"]},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


def _register_learner(client: TestClient, token: str) -> dict[str, Any]:
    body = {"name": "pool", "model": "m", "tokenizer_fingerprint": FP, "max_runs": 2}
    answer = client.post(
        "/api/v1/learners/register", json=body, headers={"Authorization": f"Bearer {token}"}
    )
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


def test_a_project_token_registers_workers_and_learners_into_its_project(
    runs_client: TestClient, admin: dict[str, str]
) -> None:
    team = _project(runs_client, admin, "team-a")
    by_name = _token(runs_client, admin, name="a", project="team-a")
    by_id = _token(runs_client, admin, name="a-by-id", project=team["id"])
    shared = _token(runs_client, admin, name="shared")
    assert by_name["project_id"] == by_id["project_id"] == team["id"]
    assert shared["project_id"] is None
    listed = {t["name"]: t for t in runs_client.get(TOKENS, headers=admin).json()}
    assert (listed["a"]["project_id"], listed["a"]["project"]) == (team["id"], "team-a")
    assert (listed["shared"]["project_id"], listed["shared"]["project"]) == (None, None)

    worker = _register_worker(runs_client, by_name["token"])
    free_worker = _register_worker(runs_client, shared["token"])
    assert worker["project_id"] == team["id"] and free_worker["project_id"] is None
    workers = {w["id"]: w for w in runs_client.get("/api/v1/workers", headers=admin).json()}
    assert (workers[worker["id"]]["project_id"], workers[worker["id"]]["project"]) == (
        team["id"],
        "team-a",
    )
    assert workers[free_worker["id"]]["project"] is None

    learner = _register_learner(runs_client, by_id["token"])
    free_learner = _register_learner(runs_client, shared["token"])
    assert learner["project_id"] == team["id"] and free_learner["project_id"] is None
    learners = {x["id"]: x for x in runs_client.get("/api/v1/learners", headers=admin).json()}
    assert learners[learner["learner_id"]]["project"] == "team-a"
    assert learners[free_learner["learner_id"]]["project_id"] is None


@pytest.mark.parametrize("project", ["team-b", "00000000-0000-0000-0000-0000000000ab"])
def test_an_unknown_project_is_422_naming_the_field_and_makes_nothing(
    runs_client: TestClient, admin: dict[str, str], project: str
) -> None:
    before = runs_client.get(TOKENS, headers=admin).json()
    answer = runs_client.post(TOKENS, json={"project": project}, headers=admin)
    assert answer.status_code == 422, answer.text
    assert answer.json()["code"] == "unknown_project" and answer.json()["field"] == "project"
    assert runs_client.get(TOKENS, headers=admin).json() == before


@pytest.mark.parametrize("project", ["", "x" * 64, 7])
def test_a_malformed_project_is_422_naming_the_field(
    runs_client: TestClient, admin: dict[str, str], project: object
) -> None:
    answer = runs_client.post(TOKENS, json={"project": project}, headers=admin)
    assert answer.status_code == 422, answer.text
    assert answer.json()["errors"][0]["field"] == "project"
