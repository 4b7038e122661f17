"""Schema by Alembic only: upgrade on an empty database, no drift, and a round trip."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import inspect, text

from server.db import make_engine
from server.migrate import check, downgrade, upgrade
from server.models import Base
from tests.conftest import _pg_url


@pytest.fixture
def empty_pg(pg_admin):  # type: ignore[no-untyped-def]
    name = f"agr_empty_{uuid.uuid4().hex[:10]}"
    with pg_admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    yield _pg_url(name)
    with pg_admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.mark.parametrize("which", ["postgres", "sqlite"])
def test_upgrade_check_downgrade_roundtrip(which, empty_pg, sqlite_url):  # type: ignore[no-untyped-def]
    engine = make_engine(empty_pg if which == "postgres" else sqlite_url)
    upgrade(engine)
    check(engine)  # raises on drift between models and schema
    tables = set(inspect(engine).get_table_names())
    assert set(Base.metadata.tables) <= tables
    downgrade(engine, "base")
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    upgrade(engine)
    check(engine)
    engine.dispose()


def test_sqlite_is_configured_for_the_lease_invariants(sqlite_url):  # type: ignore[no-untyped-def]
    engine = make_engine(sqlite_url)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 1000
        now = conn.exec_driver_sql("SELECT strftime('%Y-%m-%d %H:%M:%f','now')").scalar()
        assert "." in now  # sub-second database time
    engine.dispose()
