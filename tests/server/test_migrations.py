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


def test_schema_behind_names_what_a_server_would_miss(sqlite_url):  # type: ignore[no-untyped-def]
    """Empty or older: (the database's revision, head); at head, or at a revision this code does
    not know (a newer release's): None. `asyncgrpo server` refuses to start on the first two."""
    from server.migrate import schema_behind

    engine = make_engine(sqlite_url)
    empty = schema_behind(engine)
    assert empty is not None and empty[0] is None
    head = empty[1]
    upgrade(engine)
    assert schema_behind(engine) is None
    downgrade(engine, "-1")
    older = schema_behind(engine)
    assert older is not None and older[0] not in (None, head) and older[1] == head
    upgrade(engine)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'f00dfeedbeef'"))
    assert schema_behind(engine) is None
    engine.dispose()


def test_server_refuses_to_start_on_an_unmigrated_database(empty_pg, monkeypatch):  # type: ignore[no-untyped-def]
    """deploy/kubernetes: server pods exit until the migration Job has run, then come up."""
    from typer.testing import CliRunner

    from asyncgrpo.cli import app
    from tests.conftest import TEST_SECRET

    monkeypatch.setenv("ASYNCGRPO_DATABASE_URL", empty_pg)
    monkeypatch.setenv("ASYNCGRPO_SECURITY__SECRET_KEY", TEST_SECRET)
    result = CliRunner().invoke(app, ["server", "--port", "1"])
    assert result.exit_code == 2, result.output
    assert "schema is at nothing (empty database)" in result.output
    assert "run `asyncgrpo db upgrade` first" in result.output


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "url", ["postgresql+nosuchdriver://u@127.0.0.1/x", "not a database url", "nosuch://h/x"]
)
@pytest.mark.parametrize("command", [["server", "--port", "1"], ["jobs"]], ids=" ".join)
def test_server_names_an_unusable_database_url(url, command, monkeypatch):  # type: ignore[no-untyped-def]
    """An unknown driver or an unparsable URL exits 2 with the reason, not a traceback (the
    server's schema check, the jobs' bucket check)."""
    from typer.testing import CliRunner

    from asyncgrpo.cli import app
    from tests.conftest import TEST_SECRET

    monkeypatch.setenv("ASYNCGRPO_DATABASE_URL", url)
    monkeypatch.setenv("ASYNCGRPO_SECURITY__SECRET_KEY", TEST_SECRET)
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 2, (result.output, result.exception)
    assert "ASYNCGRPO_DATABASE_URL is not a usable database URL" in result.output
