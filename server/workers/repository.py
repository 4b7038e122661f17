from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from server.db_types import db_now
from server.models import GpuPrice, Worker


def insert(session: Session, **fields: Any) -> Worker:
    worker = Worker(**fields, last_seen_at=db_now())
    session.add(worker)
    session.flush()
    session.refresh(worker)
    return worker


def get(session: Session, worker_id: uuid.UUID) -> Worker | None:
    return session.get(Worker, worker_id)


def list_all(session: Session) -> list[Worker]:
    return list(session.execute(select(Worker).order_by(Worker.created_at)).scalars())


def set_status(session: Session, worker_id: uuid.UUID, status: str, reason: str | None) -> bool:
    result = session.execute(
        update(Worker)
        .where(Worker.id == worker_id)
        .values(status=status, quarantine_reason=reason)
        .returning(Worker.id)
    )
    return result.first() is not None


def touch(session: Session, worker_id: uuid.UUID) -> None:
    session.execute(update(Worker).where(Worker.id == worker_id).values(last_seen_at=db_now()))


def price_table(session: Session) -> dict[str, float]:
    return {p.gpu_type: p.price_per_hour for p in session.execute(select(GpuPrice)).scalars()}
