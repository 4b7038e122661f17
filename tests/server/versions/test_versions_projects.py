"""The version feed covers only the runs a worker may serve (invariant 28;
docs/architecture/security.md, "What a project's worker sees"): a worker of a project hears of
that project's runs only, and gets no adapter URL of another's; the shared fleet hears of
every project's. On both databases, on a served app (tests/server/versions/conftest.py)."""

from __future__ import annotations

import uuid

import pytest
from fastapi import FastAPI
from sqlalchemy import update

from protocol import layout
from protocol.client import AsyncGrpoClient
from server.db import transaction
from server.models import AdapterVersion, Project, Run
from tests.conftest import mint_token
from tests.server.leases.helpers import make_run, make_worker

pytestmark = pytest.mark.timeout(120)


def _published_run(app: FastAPI, project_id: uuid.UUID | None) -> uuid.UUID:
    """A running run at version 1 (its adapter row stored), in the project (None: default)."""
    with transaction(app.state.sessionmaker) as session:
        extra = {} if project_id is None else {"project_id": project_id}
        run = make_run(session, n_rows=2, **extra)
        key = layout.adapter_key(run.id, 1, "adapter_model.safetensors")
        files = {"adapter_model.safetensors": {"key": key, "sha256": "a" * 64, "bytes": 3}}
        session.add(
            AdapterVersion(
                run_id=run.id, version=1, files=files, sha256="b" * 64, bytes=3, learner_step=1
            )
        )
        session.execute(update(Run).where(Run.id == run.id).values(current_version=1))
        return run.id


def _worker(app: FastAPI, base_url: str, project_id: uuid.UUID | None) -> AsyncGrpoClient:
    with transaction(app.state.sessionmaker) as session:
        worker, _ = make_worker(session, project_id=project_id)
        worker_id = worker.id
    return AsyncGrpoClient(base_url, mint_token(app, "worker", name="w", scope_id=worker_id))


def _heard(worker: AsyncGrpoClient) -> dict[uuid.UUID, list[str]]:
    """The runs it is told of, each with the adapter URLs it is given."""
    notices = worker.wait_versions({}, wait_s=0.3)
    return {n.run_id: [f.url for f in (n.adapter.files if n.adapter else [])] for n in notices}


def test_a_project_worker_hears_only_of_its_projects_runs(
    versions_app: FastAPI, base_url: str
) -> None:
    with transaction(versions_app.state.sessionmaker) as session:
        team_a, team_b = Project(name="team-a"), Project(name="team-b")
        session.add_all([team_a, team_b])
        session.flush()
        a_id, b_id = team_a.id, team_b.id
    run_a, run_b, run_default = (_published_run(versions_app, p) for p in (a_id, b_id, None))

    heard_a = _heard(_worker(versions_app, base_url, a_id))
    assert set(heard_a) == {run_a}
    assert all(str(run_a) in url for url in heard_a[run_a]) and heard_a[run_a]
    assert set(_heard(_worker(versions_app, base_url, b_id))) == {run_b}
    assert set(_heard(_worker(versions_app, base_url, None))) == {run_a, run_b, run_default}
