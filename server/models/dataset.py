"""Datasets stored as objects in the bucket: uploaded files and Hugging Face datasets."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, ForeignKey, Index, String, Text, Uuid
from sqlalchemy.orm import Mapped, mapped_column, relationship

from server.db_types import JSONType, UTCDateTime
from server.models.base import Base, CreatedAt, UUIDPk
from server.models.project import DEFAULT_PROJECT_ID, Project


class Dataset(UUIDPk, CreatedAt, Base):
    """A dataset object: `pending` until a job has checked (uploaded) or loaded (hf) it, then
    `ready` with its rows, columns and fingerprint, or `failed` with the reason."""

    __tablename__ = "datasets"
    # One row per Hugging Face spec: runs on the same spec share the loaded object.
    __table_args__ = (Index("ix_datasets_spec_key", "spec_key", unique=True),)

    name: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(16))  # uploaded | hf
    status: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    reason: Mapped[str | None] = mapped_column(Text)
    format: Mapped[str] = mapped_column(String(16))  # jsonl | parquet
    bucket_key: Mapped[str] = mapped_column(String(1024))
    sha256: Mapped[str | None] = mapped_column(String(64))
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    row_count: Mapped[int | None] = mapped_column(BigInteger)
    columns: Mapped[list[str] | None] = mapped_column(JSONType)
    fingerprint: Mapped[str | None] = mapped_column(String(128))
    spec: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    # sha256 of the canonical hf spec and its project (None for uploads): the find-or-create
    # key (server/datasets/service.py spec_key: one row per spec in each project).
    spec_key: Mapped[str | None] = mapped_column(String(64))
    ready_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Its project (server/projects/); the default project when created without one.
    project_id: Mapped[uuid.UUID] = mapped_column(
        Uuid, ForeignKey("projects.id", ondelete="RESTRICT"), index=True, default=DEFAULT_PROJECT_ID
    )
    # Loaded when read (listings show its name).
    project: Mapped[Project] = relationship(lazy="select")
