"""All SQL of the sweeps feature."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from server.models import Run, Sweep


def insert_sweep(session: Session, **fields: Any) -> Sweep:
    sweep = Sweep(**fields)
    session.add(sweep)
    session.flush()
    return sweep


def get(session: Session, sweep_id: uuid.UUID) -> Sweep | None:
    return session.get(Sweep, sweep_id, populate_existing=True)


def list_sweeps(
    session: Session, limit: int, offset: int, project_id: uuid.UUID | None = None
) -> list[Sweep]:
    query = select(Sweep).order_by(Sweep.created_at.desc(), Sweep.id).limit(limit).offset(offset)
    if project_id is not None:
        query = query.where(Sweep.project_id == project_id)
    return list(session.execute(query).scalars())


def runs_of(session: Session, sweep_id: uuid.UUID) -> list[Run]:
    """The sweep's runs by combination index (configs not loaded)."""
    query = select(Run).where(Run.sweep_id == sweep_id).order_by(Run.sweep_index, Run.id)
    return list(session.execute(query.execution_options(populate_existing=True)).scalars())


def run_ids_of(session: Session, sweep_id: uuid.UUID) -> list[uuid.UUID]:
    query = select(Run.id).where(Run.sweep_id == sweep_id).order_by(Run.sweep_index, Run.id)
    return list(session.execute(query).scalars())


def statuses(session: Session, sweep_ids: list[uuid.UUID]) -> dict[uuid.UUID, dict[str, int]]:
    """Runs by status, per sweep."""
    out: dict[uuid.UUID, dict[str, int]] = {s: {} for s in sweep_ids}
    if not sweep_ids:
        return out
    rows = session.execute(
        select(Run.sweep_id, Run.status, func.count())
        .where(Run.sweep_id.in_(sweep_ids))
        .group_by(Run.sweep_id, Run.status)
    ).all()
    for sweep_id, status, count in rows:
        if sweep_id is not None:
            out[sweep_id][str(status)] = int(count)
    return out
