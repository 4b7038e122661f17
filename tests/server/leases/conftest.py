"""Fixtures of the lease tests.

Every test that goes through the app (HTTP) takes `lease_path` (through `lease_app`, or
directly) and so runs once per database, its name in the id: `postgres` and `sqlite`
(tests/server/leases/lease_paths.py). The Postgres runs take turns on one migrated database,
emptied before each test.

Tests that call the queue or repository functions directly on a session take `any_session`
(Postgres and SQLite, `db_url`). Tests that compare the two databases side by side take
`servers` (tests/server/leases/twins.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from tests.conftest import cloned_database, empty_database, terminate_other_backends
from tests.server.leases.lease_paths import ALL_PATHS, SQLITE, Answered, LeasePath
from tests.server.leases.twins import Servers, twin_servers


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


@pytest.fixture(scope="module")
def servers(
    pg_admin: Engine, pg_template: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Servers]:
    """The Postgres server and the SQLite one, each on its own database, for the module
    (tests/server/leases/twins.py; a test empties them first)."""
    with twin_servers(pg_admin, pg_template, tmp_path_factory.mktemp("twins")) as made:
        yield made


@pytest.fixture(scope="session")
def lease_pg_database(pg_admin: Engine, pg_template: str) -> Iterator[str]:
    """One migrated Postgres database that the lease tests' apps take in turn, emptied before
    each (a clone of the template costs ~0.4 s a test)."""
    with cloned_database(pg_admin, pg_template) as url:
        yield url


@pytest.fixture
def emptied_lease_pg_database(lease_pg_database: str) -> str:
    # Whatever an earlier test left connected (a leaked session, a server thread) holds no
    # lock on the rows about to be deleted.
    terminate_other_backends(lease_pg_database)
    engine = create_engine(lease_pg_database, poolclass=NullPool)
    try:
        empty_database(engine)
    finally:
        engine.dispose()
    return lease_pg_database


@pytest.fixture(params=ALL_PATHS)
def lease_path(request: pytest.FixtureRequest) -> LeasePath:
    """postgres or sqlite, on an empty migrated database."""
    database = "sqlite_url" if request.param == SQLITE else "emptied_lease_pg_database"
    return LeasePath(request.param, str(request.getfixturevalue(database)))


@pytest.fixture
def lease_app(lease_path: LeasePath, tmp_path: Path) -> Iterator[FastAPI]:
    """The app on the test's lease path with a local-folder bucket."""
    from server.app import create_app

    application = create_app(lease_path.settings(tmp_path / "bucket"), migrate=True)
    yield application
    application.state.engine.dispose()


@pytest.fixture
def answered(lease_app: FastAPI, lease_path: LeasePath) -> Answered:
    return Answered(lease_app.state.worker_calls, lease_path)


@pytest.fixture
def lease_client(lease_app):  # type: ignore[no-untyped-def]
    from fastapi.testclient import TestClient

    with TestClient(lease_app) as test_client:
        yield test_client


@pytest.fixture
def db(lease_app: FastAPI) -> Iterator[Session]:
    """A session on the app's database for arranging and inspecting rows (commit to publish)."""
    session = lease_app.state.sessionmaker()
    yield session
    session.rollback()
    session.close()
