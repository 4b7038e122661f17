"""Shared fixtures: real Postgres (a migrated template database cloned per test), SQLite files,
the app on either, and tokens."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session

from server.wiring import wire

# The hooks create_app fills (server/wiring.py), for the tests that call services without an app.
wire()

PG_ADMIN_URL = os.environ.get(
    "ASYNCGRPO_TEST_PG_ADMIN_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
TEST_SECRET = "test-secret-key-" + "x" * 32


def _pg_url(dbname: str) -> str:
    return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + dbname


@pytest.fixture(scope="session")
def pg_admin() -> Iterator[Engine]:
    engine = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def pg_template(pg_admin: Engine) -> Iterator[str]:
    """A database migrated to head once per session; tests clone it."""
    from server.db import make_engine
    from server.migrate import upgrade

    name = f"agr_tpl_{os.getpid()}"
    with pg_admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine = make_engine(_pg_url(name))
    upgrade(engine)
    engine.dispose()
    yield name
    with pg_admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@contextmanager
def cloned_database(pg_admin: Engine, pg_template: str) -> Iterator[str]:
    """A fresh migrated Postgres database (a clone of the template), dropped on leaving."""
    name = f"agr_t_{uuid.uuid4().hex[:12]}"
    with pg_admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"'))
    try:
        yield _pg_url(name)
    finally:
        with pg_admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def delete_as_migrated(table: Any) -> Any:
    """DELETE of every row the migrations did not make: the `default` project (migration 0014)
    stays, as in a freshly migrated database."""
    from server.models.project import DEFAULT_PROJECT_ID

    if table.name == "projects":
        return table.delete().where(table.c.id != DEFAULT_PROJECT_ID)
    return table.delete()


def empty_database(engine: Engine) -> None:
    """Every table of the app emptied and every id sequence restarted: as freshly migrated, for
    a tenth of a clone's cost (the template holds no rows; DELETE is cheaper than TRUNCATE on
    tables this small)."""
    import server.models  # noqa: F401 - every table on Base.metadata
    from server.models.base import Base

    with engine.begin() as conn:
        for table in reversed(Base.metadata.sorted_tables):
            conn.execute(delete_as_migrated(table))
        sequences = conn.execute(text("SELECT schemaname, sequencename FROM pg_sequences")).all()
        for schema, sequence in sequences:
            conn.execute(text(f'ALTER SEQUENCE "{schema}"."{sequence}" RESTART'))


@pytest.fixture
def pg_url(pg_admin: Engine, pg_template: str) -> Iterator[str]:
    """A fresh migrated Postgres database for this test."""
    with cloned_database(pg_admin, pg_template) as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'asyncgrpo.db'}"


@pytest.fixture(params=["postgres", "sqlite"])
def db_url(request: pytest.FixtureRequest) -> str:
    """Runs the test on both databases."""
    name = "pg_url" if request.param == "postgres" else "sqlite_url"
    return str(request.getfixturevalue(name))


@pytest.fixture
def db_session(pg_url: str) -> Iterator[Session]:
    """A session in one transaction, rolled back after the test."""
    from server.db import make_engine

    engine = make_engine(pg_url)
    conn = engine.connect()
    trans = conn.begin()
    session = Session(bind=conn, join_transaction_mode="create_savepoint")
    yield session
    session.close()
    trans.rollback()
    conn.close()
    engine.dispose()


def terminate_other_backends(database_url: str) -> int:
    """Drop every other connection to the database, as a database restart would; how many."""
    from sqlalchemy import create_engine, text

    killer = create_engine(database_url, isolation_level="AUTOCOMMIT")
    try:
        with killer.connect() as conn:
            return int(
                conn.execute(
                    text(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                ).scalar_one()
            )
    finally:
        killer.dispose()


def make_settings(database_url: str, bucket_dir: Path, **overrides: object):  # type: ignore[no-untyped-def]
    from server.config import Settings

    # No background scheduler unless a test asks for one: jobs would race the assertions.
    overrides.setdefault("jobs", {"mode": "celery"})
    overrides.setdefault("lease_long_poll_s", 0.0)
    return Settings(
        database_url=database_url,
        bucket_url=str(bucket_dir),
        public_url="http://testserver",
        security={"secret_key": TEST_SECRET},
        print_admin_token=False,
        **overrides,
    )


@pytest.fixture
def settings(pg_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    return make_settings(pg_url, tmp_path / "bucket")


@pytest.fixture
def app(settings):  # type: ignore[no-untyped-def]
    from server.app import create_app

    application = create_app(settings, migrate=True)
    yield application
    application.state.engine.dispose()


@pytest.fixture
def client(app):  # type: ignore[no-untyped-def]
    from fastapi.testclient import TestClient

    with TestClient(app) as test_client:
        yield test_client


def mint_token(app, kind: str, **kwargs: object) -> str:  # type: ignore[no-untyped-def]
    from server.db import transaction
    from server.tokens import service as tokens

    with transaction(app.state.sessionmaker) as session:
        return tokens.mint(session, kind, **kwargs).plaintext  # type: ignore[arg-type]


@pytest.fixture
def admin_token(app) -> str:  # type: ignore[no-untyped-def]
    return mint_token(app, "admin", name="test")


@pytest.fixture
def admin_headers(admin_token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {admin_token}"}


pytest_plugins = [
    "tests.s3_fixtures",
    "tests.ml_fixtures",
    "tests.layers",
    "tests.scheduling",
    "tests.cpu_cost",
]
