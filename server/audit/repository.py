"""The audit_entries table: insert, the refusals' window counts, the filtered page and the
retention delete. Every time is database time."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, and_, delete, func, literal, or_, select, update
from sqlalchemy.orm import Session

from server.db_types import UTCDateTime, db_now_plus, db_time_of
from server.models import AuditEntry

REFUSED = ("unauthorized", "forbidden")
SUPPRESSED = "suppressed"


def insert(session: Session, **fields: Any) -> AuditEntry:
    entry = AuditEntry(**fields)
    session.add(entry)
    session.flush()
    return entry


def _window(source: str | None, prefix: str | None) -> Any:
    """The last minute's rows of one (source, token prefix)."""
    return and_(
        AuditEntry.source.is_(None) if source is None else AuditEntry.source == source,
        AuditEntry.token_prefix.is_(None) if prefix is None else AuditEntry.token_prefix == prefix,
        AuditEntry.at > db_now_plus(-60.0),
    )


def refusals_in_window(session: Session, source: str | None, prefix: str | None) -> int:
    return session.execute(
        select(func.count())
        .select_from(AuditEntry)
        .where(_window(source, prefix), AuditEntry.outcome.in_(REFUSED))
    ).scalar_one()


def count_suppressed(session: Session, source: str | None, prefix: str | None) -> bool:
    """Add one to the window's suppressed row; False when it has none yet."""
    row = session.execute(
        select(AuditEntry.id)
        .where(_window(source, prefix), AuditEntry.outcome == SUPPRESSED)
        .order_by(AuditEntry.id.desc())
        .limit(1)
    ).scalar_one_or_none()
    if row is None:
        return False
    session.execute(
        update(AuditEntry).where(AuditEntry.id == row).values(count=AuditEntry.count + 1)
    )
    return True


@dataclass(frozen=True)
class Filters:
    """What GET /api/v1/audit narrows the log to; None: any."""

    action: str | None = None
    project_id: uuid.UUID | None = None
    token_id: uuid.UUID | None = None
    object_type: str | None = None
    object_id: str | None = None
    outcome: str | None = None
    since: datetime | None = None
    until: datetime | None = None


def _bound(when: datetime) -> Any:
    return db_time_of(literal(when, UTCDateTime()))


def _filtered(filters: Filters) -> Select[AuditEntry]:
    query = select(AuditEntry)
    columns = {
        AuditEntry.action: filters.action,
        AuditEntry.project_id: filters.project_id,
        AuditEntry.token_id: filters.token_id,
        AuditEntry.object_type: filters.object_type,
        AuditEntry.object_id: filters.object_id,
        AuditEntry.outcome: filters.outcome,
    }
    for column, value in columns.items():
        if value is not None:
            query = query.where(column == value)
    if filters.since is not None:
        query = query.where(AuditEntry.at >= _bound(filters.since))
    if filters.until is not None:
        query = query.where(AuditEntry.at < _bound(filters.until))
    return query


def page(session: Session, filters: Filters, limit: int, after_id: int | None) -> list[AuditEntry]:
    """Newest first by (at, id), a stable order: the next page starts below the last row's
    (at, id), read from that row itself (so the comparison is the database's own, on SQLite's
    text timestamps too). A cursor row deleted by retention took every older row with it."""
    query = _filtered(filters)
    if after_id is not None:
        last = select(AuditEntry.at, AuditEntry.id).where(AuditEntry.id == after_id).subquery()
        same_instant = and_(AuditEntry.at == last.c.at, AuditEntry.id < last.c.id)
        query = query.join(last, or_(AuditEntry.at < last.c.at, same_instant))
    query = query.order_by(AuditEntry.at.desc(), AuditEntry.id.desc()).limit(limit)
    return list(session.execute(query).scalars())


def delete_older_than(session: Session, days: float) -> int:
    cutoff = db_now_plus(-days * 86_400.0)
    result = session.execute(delete(AuditEntry).where(AuditEntry.at < cutoff))
    return int(result.rowcount)  # type: ignore[attr-defined]
