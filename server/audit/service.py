"""Reading the audit log (a page, the CSV export) and its retention."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator

from sqlalchemy.orm import Session, sessionmaker

from server.audit import repository
from server.audit.repository import Filters
from server.audit.schemas import AuditEntryOut, AuditPage
from server.db import transaction

CSV_COLUMNS = list(AuditEntryOut.model_fields)
CSV_PAGE = 500


def page(session: Session, filters: Filters, limit: int, cursor: int | None) -> AuditPage:
    rows = repository.page(session, filters, limit + 1, cursor)
    more = len(rows) > limit
    entries = [AuditEntryOut.model_validate(r) for r in rows[:limit]]
    return AuditPage(entries=entries, next_cursor=entries[-1].id if more else None)


def _csv_line(values: list[object]) -> str:
    out = io.StringIO()
    csv.writer(out).writerow(values)
    return out.getvalue()


def csv_lines(factory: sessionmaker[Session], filters: Filters) -> Iterator[str]:
    """The header, then every matching entry, newest first: each page read in a short
    transaction of its own (on SQLite a transaction holds the one write lock)."""
    yield _csv_line(list(CSV_COLUMNS))
    cursor: int | None = None
    while True:
        with transaction(factory) as session:
            rows = repository.page(session, filters, CSV_PAGE, cursor)
            entries = [AuditEntryOut.model_validate(r) for r in rows]
        for entry in entries:
            data = entry.model_dump(mode="json")
            yield _csv_line(["" if data[c] is None else data[c] for c in CSV_COLUMNS])
        if len(entries) < CSV_PAGE:
            return
        cursor = entries[-1].id


def purge(session: Session, retention_days: float) -> int:
    """Entries older than the retention deleted; how many."""
    return repository.delete_older_than(session, retention_days)
