"""Upgrade to 0014 (projects) of a database in use, on Postgres and SQLite: rows made by the
real services (runs, tokens, a registered worker, a lease in flight) at revision 0013, then
`upgrade`: every run is in the `default` project, the worker and the registration token are
the shared fleet (project_id NULL), and everything keeps working: the lease in flight
heartbeats and completes, the worker gets its next lease, the tokens authenticate
(docs/guides/projects.md, "Upgrading")."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, inspect, text

from server.db import make_engine
from server.migrate import downgrade, upgrade
from server.models.project import DEFAULT_PROJECT_ID
from tests.conftest import make_settings, mint_token
from tests.server.leases.helpers import MODEL, acquire_lease, bearer, make_run, work_one_lease
from tests.server.test_migrations import empty_pg

__all__ = ["empty_pg"]

pytestmark = pytest.mark.timeout(180)


def _app(url: str, bucket: Path) -> Any:
    from server.app import create_app

    return create_app(make_settings(url, bucket), migrate=False)


def _fill_at_0013(engine: Engine, url: str, bucket: Path) -> dict[str, Any]:
    """Runs, tokens, a registered worker and a lease in flight, made by this code's services;
    then the schema is taken back to 0013 (what an installation of the release before has)."""
    upgrade(engine)
    app = _app(url, bucket)
    with TestClient(app) as client:
        admin = mint_token(app, "admin", name="admin")
        registration = mint_token(app, "registration", name="fleet", max_uses=5)
        answer = client.post(
            "/api/v1/workers/register",
            json={"name": "w1", "models": [MODEL]},
            headers=bearer(registration),
        )
        assert answer.status_code == 201, answer.text
        worker_token = answer.json()["token"]
        session = app.state.sessionmaker()
        run = make_run(session, n_rows=8)
        session.commit()
        session.close()
        lease = acquire_lease(client, worker_token)
    app.state.engine.dispose()
    downgrade(engine, "0013")
    assert "projects" not in inspect(engine).get_table_names()
    assert "project_id" not in {c["name"] for c in inspect(engine).get_columns("runs")}
    return {
        "admin": admin,
        "registration": registration,
        "worker": worker_token,
        "run_id": run.id,
        "lease": lease,
    }


@pytest.mark.parametrize("which", ["postgres", "sqlite"])
def test_an_0013_database_upgrades_and_keeps_working(
    which: str, empty_pg: str, sqlite_url: str, tmp_path: Path
) -> None:
    url = empty_pg if which == "postgres" else sqlite_url
    engine = make_engine(url)
    made = _fill_at_0013(engine, url, tmp_path / "bucket")

    upgrade(engine)

    with engine.connect() as conn:
        projects = conn.execute(text("SELECT id, name FROM projects")).all()
        assert [(uuid.UUID(str(i)), n) for i, n in projects] == [(DEFAULT_PROJECT_ID, "default")]
        for table in ("runs", "sweeps", "datasets"):
            nulls = f"SELECT count(*) FROM {table} WHERE project_id IS NULL"
            assert conn.execute(text(nulls)).scalar_one() == 0
        run_projects = conn.execute(text("SELECT DISTINCT project_id FROM runs")).scalars()
        assert [uuid.UUID(str(p)) for p in run_projects] == [DEFAULT_PROJECT_ID]
        for table in ("workers", "tokens", "pool_learners"):
            owned = f"SELECT count(*) FROM {table} WHERE project_id IS NOT NULL"
            assert conn.execute(text(owned)).scalar_one() == 0  # the shared fleet
    engine.dispose()

    app = _app(url, tmp_path / "bucket")
    with TestClient(app) as client:
        lease = made["lease"]
        worker = bearer(made["worker"])
        beat = client.post(
            f"/api/v1/leases/{lease['lease_id']}/heartbeat",
            json={"fencing": lease["fencing"]},
            headers=worker,
        )
        assert beat.status_code == 200, beat.text
        for _ in range(2):  # a new lease's round trip, then the next one
            assert work_one_lease(client, worker) is not None
        runs = client.get("/api/v1/runs", headers=bearer(made["admin"]))
        assert runs.status_code == 200, runs.text
        assert [(r["id"], r["project"]) for r in runs.json()] == [(str(made["run_id"]), "default")]
        again = client.post(
            "/api/v1/workers/register",
            json={"name": "w2", "models": [MODEL]},
            headers=bearer(made["registration"]),
        )
        assert again.status_code == 201, again.text
    app.state.engine.dispose()
