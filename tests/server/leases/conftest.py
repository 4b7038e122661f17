from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy.orm import Session


@pytest.fixture
def any_session(db_url: str) -> Iterator[Session]:
    """A session on a fresh migrated database, Postgres or SQLite (the single-writer path)."""
    from server.db import make_engine, make_sessionmaker
    from server.migrate import upgrade

    engine = make_engine(db_url)
    if db_url.startswith("sqlite"):
        upgrade(engine)
    session = make_sessionmaker(engine)()
    yield session
    session.rollback()
    session.close()
    engine.dispose()


@pytest.fixture
def lease_app(db_url: str, tmp_path):  # type: ignore[no-untyped-def]
    """The app on Postgres or SQLite with a local-folder bucket."""
    from server.app import create_app
    from tests.conftest import make_settings

    application = create_app(make_settings(db_url, tmp_path / "bucket"), migrate=True)
    yield application
    application.state.engine.dispose()


@pytest.fixture
def lease_client(lease_app):  # type: ignore[no-untyped-def]
    from fastapi.testclient import TestClient

    with TestClient(lease_app) as test_client:
        yield test_client


@pytest.fixture
def db(lease_app) -> Iterator[Session]:  # type: ignore[no-untyped-def]
    """A session on the app's database for arranging and inspecting rows (commit to publish)."""
    session = lease_app.state.sessionmaker()
    yield session
    session.rollback()
    session.close()
