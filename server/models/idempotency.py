from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Index, Integer, LargeBinary, String, Uuid
from sqlalchemy.orm import Mapped, mapped_column

from server.db_types import JSONType, UTCDateTime
from server.models.base import Base, CreatedAt


class IdempotentAnswer(CreatedAt, Base):
    """The answer a state-changing call gave under its caller's Idempotency-Key, written in the
    transaction of the change and replayed to a repeat of the key (server/idempotency/)."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (Index("ix_idempotency_keys_created_at", "created_at"),)

    scope: Mapped[str] = mapped_column(String(64), primary_key=True)  # the caller's token digest
    key: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    key_time: Mapped[datetime] = mapped_column(UTCDateTime)  # the caller's clock (the UUIDv7)
    fingerprint: Mapped[str] = mapped_column(String(64))  # sha256 of method, path and body
    status_code: Mapped[int | None] = mapped_column(Integer)  # None while its call runs
    body: Mapped[bytes | None] = mapped_column(LargeBinary)
    headers: Mapped[dict[str, Any] | None] = mapped_column(JSONType)


class IdempotencyWatermark(Base):
    """Per caller, the latest key time of the answers retention let go of: a key made at or
    before it may have been applied and forgotten, so it is refused, never applied again."""

    __tablename__ = "idempotency_watermarks"

    scope: Mapped[str] = mapped_column(String(64), primary_key=True)
    key_time: Mapped[datetime] = mapped_column(UTCDateTime)
