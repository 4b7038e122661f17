"""The audit tests: the runs tests' app on Postgres and SQLite (tests/server/runs/conftest.py),
and reading the log back."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from server.db import transaction
from server.models import AuditEntry
from tests.server.runs.conftest import admin, db, runs_app, runs_client

__all__ = ["admin", "db", "runs_app", "runs_client", "entries", "entries_in", "bearer"]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def entries(app: Any, **where: Any) -> list[AuditEntry]:
    """The app's log rows in the order they were written, of the given column values."""
    return entries_in(app.state.sessionmaker, **where)


def entries_in(factory: sessionmaker[Session], **where: Any) -> list[AuditEntry]:
    with transaction(factory) as session:
        query = select(AuditEntry).order_by(AuditEntry.id)
        for column, value in where.items():
            query = query.where(getattr(AuditEntry, column) == value)
        rows = list(session.execute(query).scalars())
        session.expunge_all()
    return rows
