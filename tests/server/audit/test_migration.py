"""Migration 0016 (audit entries) goes down to 0015 and up again on Postgres and SQLite, leaving
the rest of the schema as it was and the log empty but working (docs/guides/audit.md)."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect, text

from server.db import make_engine
from server.migrate import check, downgrade, upgrade

pytestmark = pytest.mark.timeout(120)


def test_0016_down_and_up(db_url: str) -> None:
    engine = make_engine(db_url)
    upgrade(engine)  # SQLite: a new file, migrated here; Postgres: the clone, already at head
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO audit_entries (action, outcome, count) VALUES ('x', 'ok', 1)")
        )
    tables = set(inspect(engine).get_table_names())
    downgrade(engine, "0015")
    assert set(inspect(engine).get_table_names()) == tables - {"audit_entries"}
    upgrade(engine)
    check(engine)
    with engine.begin() as conn:
        assert conn.execute(text("SELECT count(*) FROM audit_entries")).scalar_one() == 0
        conn.execute(
            text("INSERT INTO audit_entries (action, outcome, count) VALUES ('y', 'ok', 1)")
        )
        at = conn.execute(text("SELECT at FROM audit_entries")).scalar_one()
    assert at is not None  # database time by default
    engine.dispose()
