"""The reads of the version watch: the running runs' versions, and one version's adapter row.
Run in a thread (server/versions/service.py)."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from server.models import AdapterVersion, Run

RunRow = tuple[uuid.UUID, str, uuid.UUID, int]  # id, base model, project, current version
Adapter = tuple[str, dict[str, Any]]  # the version's sha256, files


def running_runs(session: Session) -> list[RunRow]:
    rows = session.execute(
        select(Run.id, Run.base_model, Run.project_id, Run.current_version).where(
            Run.status == "running"
        )
    ).all()
    return [(r.id, r.base_model, r.project_id, r.current_version) for r in rows]


def adapter(session: Session, run_id: uuid.UUID, version: int) -> Adapter | None:
    row = session.execute(
        select(AdapterVersion.sha256, AdapterVersion.files).where(
            AdapterVersion.run_id == run_id, AdapterVersion.version == version
        )
    ).first()
    return None if row is None else (row.sha256, row.files)
