from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import BigInteger, Boolean, ForeignKey, Integer, String, UniqueConstraint, Uuid
from sqlalchemy.orm import Mapped, mapped_column

from server.db_types import JSONType
from server.models.base import Base, CreatedAt, UUIDPk


class AdapterVersion(UUIDPk, CreatedAt, Base):
    """An immutable published adapter version (version 0, the base model, has no row)."""

    __tablename__ = "adapter_versions"
    __table_args__ = (UniqueConstraint("run_id", "version", name="uq_adapter_versions_run_ver"),)

    run_id: Mapped[uuid.UUID] = mapped_column(Uuid, ForeignKey("runs.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer)
    # {"adapter_model.safetensors": {"key": ..., "sha256": ..., "bytes": ...}, ...}
    files: Mapped[dict[str, Any]] = mapped_column(JSONType)
    checkpoint_files: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    sha256: Mapped[str] = mapped_column(String(64))
    bytes: Mapped[int] = mapped_column(BigInteger)
    learner_step: Mapped[int] = mapped_column(Integer)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    final: Mapped[bool] = mapped_column(Boolean, default=False)
    deleted: Mapped[bool] = mapped_column(Boolean, default=False)
