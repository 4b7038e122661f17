"""Projects scope the fleet (invariant 28; docs/architecture/lease-engine.md, "Projects"): a
worker of a project is granted only that project's runs and told only of their versions, a
worker of the shared fleet is granted every project's, and a run's fair-share contenders (and
the live workers its `serving` answer counts) are only the workers that can serve it; on both
databases (Postgres and SQLite)."""

from __future__ import annotations

import uuid

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from protocol.schemas import VERSIONS_HEADER, parse_versions_header
from server.models import Lease, Project, Run
from server.tokens import service as tokens
from tests.server.leases.helpers import bearer, in_flight, make_run, make_worker

pytestmark = pytest.mark.timeout(120)

ACQUIRE = "/api/v1/leases/acquire"
# prompts_per_lease 2 and an admission bound of 8 rows (tests/server/leases/test_fair_share.py).
BOUND = 8
TOOLS = {"name": "tool_calls", "tools": ["calculator"], "max_turns": 2, "max_total_tokens": 512}


def _project(db: Session, name: str) -> uuid.UUID:
    project = Project(name=name)
    db.add(project)
    db.flush()
    return project.id


def _acquire_all(client: TestClient, token: str) -> tuple[list[uuid.UUID], dict[uuid.UUID, int]]:
    """Acquire until 204: the run of every lease granted, and the last answer's versions."""
    runs: list[uuid.UUID] = []
    while True:
        answer = client.post(ACQUIRE, json={}, headers=bearer(token))
        versions = parse_versions_header(answer.headers[VERSIONS_HEADER])
        if answer.status_code == 204:
            return runs, versions
        assert answer.status_code == 200, answer.text
        runs.append(uuid.UUID(answer.json()["run_id"]))
        assert len(runs) <= 50


def _leased_runs(db: Session, worker_id: uuid.UUID) -> set[uuid.UUID]:
    db.expire_all()
    found = set(db.execute(select(Lease.run_id).where(Lease.worker_id == worker_id)).scalars())
    db.commit()  # no read transaction left open (SQLite's single writer)
    return found


def test_a_project_worker_gets_only_its_projects_runs_and_a_shared_one_every_projects(
    lease_client: TestClient, db: Session
) -> None:
    team_a, team_b = _project(db, "team-a"), _project(db, "team-b")
    run_a = make_run(db, n_rows=2, epochs=1, project_id=team_a)
    run_b = make_run(db, n_rows=2, epochs=1, project_id=team_b, priority=5)  # fairest first
    worker_a, token_a = make_worker(db, name="a", project_id=team_a)
    shared, shared_token = make_worker(db, name="shared")
    db.commit()

    granted, versions = _acquire_all(lease_client, token_a)
    assert granted == [run_a.id]  # one lease of its two rows; team-b's run, first, never
    assert versions == {run_a.id: 0}  # nor is it told of team-b's run
    assert _leased_runs(db, worker_a.id) == {run_a.id}

    make_run(db, n_rows=2, epochs=1, project_id=team_a, run_id=(more_a := uuid.uuid4()))
    db.commit()
    granted, versions = _acquire_all(lease_client, shared_token)
    assert set(granted) == {run_b.id, more_a}  # the shared fleet serves every project
    assert versions == {run_a.id: 0, run_b.id: 0, more_a: 0}
    assert _leased_runs(db, shared.id) == {run_b.id, more_a}


def test_a_project_worker_gets_nothing_while_only_other_projects_wait(
    lease_client: TestClient, db: Session
) -> None:
    team_a, team_b = _project(db, "team-a"), _project(db, "team-b")
    make_run(db, n_rows=4, project_id=team_b)
    make_run(db, n_rows=4)  # the default project's
    worker, token = make_worker(db, project_id=team_a)
    db.commit()
    assert _acquire_all(lease_client, token) == ([], {})
    assert _leased_runs(db, worker.id) == set()


@pytest.mark.parametrize(
    ("waiting_project", "held"),
    [("other", BOUND), ("same", BOUND // 2), ("shared", BOUND // 2)],
    ids=["another-projects-worker-does-not-contend", "same-project-contends", "shared-contends"],
)
def test_only_workers_that_can_serve_the_run_contend_for_it(
    lease_client: TestClient, db: Session, waiting_project: str, held: int
) -> None:
    team_a, team_b = _project(db, "team-a"), _project(db, "team-b")
    run = make_run(db, n_rows=20, status="paused", project_id=team_a)
    worker, token = make_worker(db, name="first", project_id=team_a)
    waiting_in = {"other": team_b, "same": team_a, "shared": None}[waiting_project]
    _, waiting_token = make_worker(db, name="waiting", project_id=waiting_in)
    db.commit()
    # It asks while nothing is admissible: it is waiting (and would contend for every run it
    # can serve).
    assert lease_client.post(ACQUIRE, json={}, headers=bearer(waiting_token)).status_code == 204
    db.execute(update(Run).where(Run.id == run.id).values(status="running"))
    db.commit()
    _acquire_all(lease_client, token)
    db.expire_all()
    rows = db.execute(
        select(func.coalesce(func.sum(Lease.n_prompts), 0)).where(Lease.worker_id == worker.id)
    ).scalar_one()
    db.commit()
    assert rows == held
    assert in_flight(db, run.id) == held


def test_a_runs_serving_problem_counts_only_workers_that_serve_its_project(
    lease_client: TestClient, db: Session
) -> None:
    team_a, team_b = _project(db, "team-a"), _project(db, "team-b")
    run = make_run(db, project_id=team_a, environment=TOOLS)
    _, other_token = make_worker(db, name="b", project_id=team_b)
    _, shared_token = make_worker(db, name="shared")
    admin = bearer(tokens.mint(db, "admin").plaintext)
    db.commit()

    def serving() -> object:
        answer = lease_client.get(f"/api/v1/runs/{run.id}", headers=admin)
        assert answer.status_code == 200, answer.text
        return answer.json()["serving"]

    assert lease_client.post(ACQUIRE, json={}, headers=bearer(other_token)).status_code == 204
    assert serving() is None  # team-b's live worker is none of the run's: nothing known
    assert lease_client.post(ACQUIRE, json={}, headers=bearer(shared_token)).status_code == 204
    problem = serving()
    assert isinstance(problem, dict) and problem["code"] == "no_worker_can_serve"
    assert problem["workers"] == 1  # the shared one, which cannot run tool_calls
