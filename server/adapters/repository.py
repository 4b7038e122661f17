"""All SQL of the admin adapter reads."""

from __future__ import annotations

import uuid

from sqlalchemy import select
from sqlalchemy.orm import Session

from server.models import AdapterVersion


def list_versions(session: Session, run_id: uuid.UUID) -> list[AdapterVersion]:
    query = (
        select(AdapterVersion)
        .where(AdapterVersion.run_id == run_id)
        .order_by(AdapterVersion.version)
    )
    return list(session.execute(query).scalars())


def by_version(session: Session, run_id: uuid.UUID, version: int) -> AdapterVersion | None:
    query = select(AdapterVersion).where(
        AdapterVersion.run_id == run_id, AdapterVersion.version == version
    )
    return session.execute(query).scalar_one_or_none()


def latest(session: Session, run_id: uuid.UUID) -> AdapterVersion | None:
    query = (
        select(AdapterVersion)
        .where(AdapterVersion.run_id == run_id)
        .order_by(AdapterVersion.version.desc())
        .limit(1)
    )
    return session.execute(query).scalar_one_or_none()


def final(session: Session, run_id: uuid.UUID) -> AdapterVersion | None:
    query = (
        select(AdapterVersion)
        .where(AdapterVersion.run_id == run_id, AdapterVersion.final.is_(True))
        .order_by(AdapterVersion.version.desc())
        .limit(1)
    )
    return session.execute(query).scalar_one_or_none()
