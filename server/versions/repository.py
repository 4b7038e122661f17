"""The reads of the version watch: the running runs' versions, and one version's adapter row.
Portable (SQLAlchemy, in a thread) and Postgres (psycopg's async pool, on the event loop)."""

from __future__ import annotations

import uuid
from typing import Any

from psycopg import AsyncConnection
from sqlalchemy import select
from sqlalchemy.orm import Session

from server.models import AdapterVersion, Run

RunRow = tuple[uuid.UUID, str, int]  # id, base model, current version
Adapter = tuple[str, dict[str, Any]]  # the version's sha256, files

_RUNNING_SQL = "SELECT id, base_model, current_version FROM runs WHERE status = 'running'"
_ADAPTER_SQL = (
    "SELECT sha256, files FROM adapter_versions WHERE run_id = %(run_id)s AND version = %(version)s"
)


def running_runs(session: Session) -> list[RunRow]:
    rows = session.execute(
        select(Run.id, Run.base_model, Run.current_version).where(Run.status == "running")
    ).all()
    return [(r.id, r.base_model, r.current_version) for r in rows]


def adapter(session: Session, run_id: uuid.UUID, version: int) -> Adapter | None:
    row = session.execute(
        select(AdapterVersion.sha256, AdapterVersion.files).where(
            AdapterVersion.run_id == run_id, AdapterVersion.version == version
        )
    ).first()
    return None if row is None else (row.sha256, row.files)


async def running_runs_async(conn: AsyncConnection[Any]) -> list[RunRow]:
    cursor = await conn.execute(_RUNNING_SQL)
    return [(r[0], r[1], int(r[2])) for r in await cursor.fetchall()]


async def adapter_async(
    conn: AsyncConnection[Any], run_id: uuid.UUID, version: int
) -> Adapter | None:
    cursor = await conn.execute(_ADAPTER_SQL, {"run_id": run_id, "version": version})
    row = await cursor.fetchone()
    return None if row is None else (row[0], row[1])
