"""The embedded default: the app's lifespan runs the same job functions on threads."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from server.app import create_app
from server.db import transaction
from server.models import Lease, PromptRow
from tests.conftest import make_settings
from tests.server.jobs.factories import acquire, expire, new_run, new_worker

FAST = {f"{job}_interval_s": 0.2 for job in ("sweep", "cost", "budget", "alarm", "webhook")}


@pytest.mark.timeout(60)
def test_inprocess_scheduler_sweeps_expired_leases(db_url: str, tmp_path: Path) -> None:
    settings = make_settings(db_url, tmp_path / "bucket", jobs={"mode": "inprocess", **FAST})
    app = create_app(settings, migrate=True)
    with TestClient(app):
        assert app.state.scheduler is not None
        with transaction(app.state.sessionmaker) as session:
            new_run(session)
            lease_id = acquire(session, app.state.store, settings, new_worker(session))
            expire(session, lease_id)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with transaction(app.state.sessionmaker) as session:
                if session.get(Lease, lease_id).state == "expired":
                    break
            time.sleep(0.1)
        with transaction(app.state.sessionmaker) as session:
            assert session.get(Lease, lease_id).state == "expired"
            assert set(session.execute(select(PromptRow.state)).scalars()) == {"queued"}
    assert app.state.scheduler.runs["costs"] > 0


def test_celery_mode_starts_no_inprocess_scheduler(pg_url: str, tmp_path: Path) -> None:
    settings = make_settings(pg_url, tmp_path / "bucket", jobs={"mode": "celery"})
    app = create_app(settings, migrate=True)
    with TestClient(app):
        assert app.state.scheduler is None
