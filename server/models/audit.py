"""The audit log: one row per state-changing call, written in the change's own transaction,
and one per refused call (401/403), written in a transaction of its own (server/audit/;
docs/architecture/security.md, "The audit log")."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Index, Integer, String, Uuid
from sqlalchemy.orm import Mapped, mapped_column

from server.db_types import BigIntPK, JSONType, UTCDateTime, db_now
from server.models.base import Base


class AuditEntry(Base):
    __tablename__ = "audit_entries"
    __table_args__ = (
        Index("ix_audit_entries_at_id", "at", "id"),
        Index("ix_audit_entries_project_at", "project_id", "at"),
        Index("ix_audit_entries_source_prefix_at", "source", "token_prefix", "at"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=db_now())
    # No foreign keys: an entry outlives the token, project or object it names.
    token_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    token_name: Mapped[str | None] = mapped_column(String(200))
    token_prefix: Mapped[str | None] = mapped_column(String(32))
    # A free string, not an enum: today a token's kind (admin, registration, worker, ...), and
    # the roles to come (owner, member, ci, viewer) without a migration.
    role: Mapped[str | None] = mapped_column(String(32))
    project_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    action: Mapped[str] = mapped_column(String(64))
    object_type: Mapped[str | None] = mapped_column(String(32))
    object_id: Mapped[str | None] = mapped_column(String(64))
    source: Mapped[str | None] = mapped_column(String(64))
    outcome: Mapped[str] = mapped_column(String(16))  # ok | unauthorized | forbidden | suppressed
    # How many calls the row stands for: 1, or a suppressed row's refusals over the limit.
    count: Mapped[int] = mapped_column(Integer, default=1)
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
