"""All SQL of the datasets feature."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import delete, or_, select, update
from sqlalchemy.orm import Session

from server.db_types import db_now
from server.models import Dataset, Run


def insert(session: Session, **fields: Any) -> Dataset:
    dataset = Dataset(**fields)
    session.add(dataset)
    session.flush()
    return dataset


def get(session: Session, dataset_id: uuid.UUID) -> Dataset | None:
    return session.get(Dataset, dataset_id, populate_existing=True)


def get_for_share(session: Session, dataset_id: uuid.UUID) -> Dataset | None:
    """The dataset, its row locked FOR SHARE until the transaction ends (a run being created on
    it): a concurrent delete waits, and a delete in progress is waited for (then None)."""
    query = select(Dataset).where(Dataset.id == dataset_id).with_for_update(read=True)
    return session.execute(query.execution_options(populate_existing=True)).scalar_one_or_none()


def by_spec_key(session: Session, spec_key: str) -> Dataset | None:
    return session.execute(select(Dataset).where(Dataset.spec_key == spec_key)).scalar_one_or_none()


def list_datasets(
    session: Session, limit: int, offset: int, project_id: uuid.UUID | None = None
) -> list[Dataset]:
    query = select(Dataset).order_by(Dataset.created_at.desc(), Dataset.id)
    if project_id is not None:
        query = query.where(Dataset.project_id == project_id)
    return list(session.execute(query.limit(limit).offset(offset)).scalars())


def pending_ids(session: Session) -> list[uuid.UUID]:
    query = select(Dataset.id).where(Dataset.status == "pending").order_by(Dataset.created_at)
    return list(session.execute(query).scalars())


def finish(session: Session, dataset_id: uuid.UUID, **values: Any) -> bool:
    """pending → ready or failed (compare-and-set): False when another pass got there first."""
    if values.get("status") == "ready":
        values["ready_at"] = db_now()
    row = session.execute(
        update(Dataset)
        .where(Dataset.id == dataset_id, Dataset.status == "pending")
        .values(**values)
        .returning(Dataset.id)
        .execution_options(synchronize_session=False)
    ).first()
    return row is not None


def retry(session: Session, dataset_id: uuid.UUID) -> None:
    """A failed hf dataset asked for again goes back to pending (the Hub may be back)."""
    session.execute(
        update(Dataset)
        .where(Dataset.id == dataset_id, Dataset.status == "failed")
        .values(status="pending", reason=None)
        .execution_options(synchronize_session=False)
    )


def runs_using(session: Session, dataset_id: uuid.UUID) -> list[uuid.UUID]:
    uses = or_(Run.dataset_id == dataset_id, Run.eval_dataset_id == dataset_id)
    return list(session.execute(select(Run.id).where(uses)).scalars())


def remove(session: Session, dataset_id: uuid.UUID) -> None:
    session.execute(delete(Dataset).where(Dataset.id == dataset_id))
