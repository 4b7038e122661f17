"""Fixtures of the datasets tests: the app on Postgres or SQLite with a local-folder bucket,
an admin, and the datasets / run_prep jobs run on demand (no background scheduler)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session


@pytest.fixture
def ds_app(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    from server.app import create_app
    from tests.conftest import make_settings

    application = create_app(make_settings(db_url, tmp_path / "bucket"), migrate=True)
    yield application
    application.state.engine.dispose()


@pytest.fixture
def ds_client(ds_app):  # type: ignore[no-untyped-def]
    from fastapi.testclient import TestClient

    with TestClient(ds_app) as client:
        yield client


@pytest.fixture
def admin(ds_app) -> dict[str, str]:  # type: ignore[no-untyped-def]
    from tests.conftest import mint_token

    return {"Authorization": f"Bearer {mint_token(ds_app, 'admin', name='t')}"}


@pytest.fixture
def db(ds_app) -> Iterator[Session]:  # type: ignore[no-untyped-def]
    session = ds_app.state.sessionmaker()
    yield session
    session.rollback()
    session.close()


@pytest.fixture
def run_jobs(ds_app):  # type: ignore[no-untyped-def]
    """Run the given jobs once each, in order, as the scheduler would."""
    from server.jobs.runner import JobContext, run_job

    ctx = JobContext(
        settings=ds_app.state.settings,
        factory=ds_app.state.sessionmaker,
        store_factory=lambda: ds_app.state.store,
    )

    def run(*jobs: str) -> list[Any]:
        return [run_job(job, ctx) for job in jobs]

    return run
