"""A pool learner takes only runs of the project it serves (invariant 28): one registered with
a project's registration token takes that project's runs, one registered with a shared token
takes every project's; on Postgres and SQLite."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from server.db import transaction
from server.models import Run
from tests.server.learner.support import make_run, run_row
from tests.server.learners.conftest import bearer, register_body, take, taken_ids

pytestmark = pytest.mark.timeout(120)


def _in_project(client: TestClient, admin: dict[str, str], name: str) -> str:
    """A new project and a registration token of it."""
    assert client.post("/api/v1/projects", json={"name": name}, headers=admin).status_code == 201
    return _token(client, admin, project=name)


def _token(client: TestClient, admin: dict[str, str], **body: Any) -> str:
    made = client.post("/api/v1/registration-tokens", json=body, headers=admin)
    assert made.status_code == 201, made.text
    return str(made.json()["token"])


def _register(client: TestClient, token: str, name: str) -> dict[str, str]:
    answer = client.post(
        "/api/v1/learners/register", json=register_body(name=name), headers=bearer(token)
    )
    assert answer.status_code == 201, answer.text
    return bearer(answer.json()["learner_token"])


def _run_in(app: Any, client: TestClient, admin: dict[str, str], project: str) -> uuid.UUID:
    run = make_run(app)
    projects = client.get("/api/v1/projects", headers=admin).json()
    project_id = uuid.UUID(next(p["id"] for p in projects if p["name"] == project))
    with transaction(app.state.sessionmaker) as session:
        session.execute(update(Run).where(Run.id == run.id).values(project_id=project_id))
    return run.id


def test_a_project_pool_learner_takes_only_its_projects_runs(
    runs_app: Any, runs_client: TestClient, admin: dict[str, str]
) -> None:
    team_a = _register(runs_client, _in_project(runs_client, admin, "team-a"), "pool-a")
    team_b_token = _in_project(runs_client, admin, "team-b")
    run_b = _run_in(runs_app, runs_client, admin, "team-b")  # the oldest: taken first if it could
    run_a = _run_in(runs_app, runs_client, admin, "team-a")
    run_default = make_run(runs_app).id
    assert taken_ids(take(runs_client, team_a, 4)) == [run_a]
    assert run_row(runs_app, run_b).pool_learner_id is None
    assert run_row(runs_app, run_default).pool_learner_id is None
    team_b = _register(runs_client, team_b_token, "pool-b")
    assert taken_ids(take(runs_client, team_b, 4)) == [run_b]
    more_a = _run_in(runs_app, runs_client, admin, "team-a")
    shared = _register(runs_client, _token(runs_client, admin), "pool-shared")
    assert taken_ids(take(runs_client, shared, 4)) == [run_default, more_a]
