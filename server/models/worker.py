from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, Float, ForeignKey, Integer, String, Uuid, false
from sqlalchemy.orm import Mapped, mapped_column, relationship

from server.db_types import JSONType, UTCDateTime
from server.models.base import Base, CreatedAt, UUIDPk
from server.models.project import Project


class Worker(UUIDPk, CreatedAt, Base):
    __tablename__ = "workers"

    name: Mapped[str] = mapped_column(String(200))
    gpu_type: Mapped[str] = mapped_column(String(100), default="cpu")
    gpu_count: Mapped[int] = mapped_column(Integer, default=1)
    price_per_hour: Mapped[float] = mapped_column(Float, default=0.0)
    price_override: Mapped[float | None] = mapped_column(Float)
    models: Mapped[list[str]] = mapped_column(JSONType, default=list)
    # What the worker declared it can run (EnvironmentAllowlist.names(): built-ins, entry-point
    # names, `module:*`); a worker that declares nothing runs single_turn only.
    environments: Mapped[list[str]] = mapped_column(
        JSONType, default=lambda: ["single_turn"], server_default='["single_turn"]'
    )
    # What its engine can load (protocol/capabilities.py WorkerCapabilities, as a dict); NULL:
    # never declared, it serves every run.
    capabilities: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    # An admin's mark: grants of runs whose environment requires a trusted worker go only here.
    trusted: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    status: Mapped[str] = mapped_column(String(16), default="active", index=True)
    last_seen_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Set by an acquire try that granted nothing, cleared by a grant: the worker is waiting
    # for work (a contender in server/leases/fair_share.py).
    waiting_since: Mapped[datetime | None] = mapped_column(UTCDateTime)
    registration_token_id: Mapped[uuid.UUID | None] = mapped_column(
        Uuid, ForeignKey("tokens.id", ondelete="SET NULL")
    )
    accepted_batches: Mapped[int] = mapped_column(Integer, default=0)
    rejected_batches: Mapped[int] = mapped_column(Integer, default=0)
    spot_checks: Mapped[int] = mapped_column(Integer, default=0)
    spot_check_mismatch: Mapped[float | None] = mapped_column(Float)
    quarantine_reason: Mapped[str | None] = mapped_column(String(500))
    # The project it serves (server/projects/); None: the shared fleet, it serves every project.
    project_id: Mapped[uuid.UUID | None] = mapped_column(
        Uuid, ForeignKey("projects.id", ondelete="RESTRICT"), index=True
    )
    # Loaded when read (listings show its name): one query per project in a session.
    project: Mapped[Project | None] = relationship(lazy="select")


class GpuPrice(Base):
    """Admin price table: overrides a worker's self-reported price for its GPU type."""

    __tablename__ = "gpu_prices"

    gpu_type: Mapped[str] = mapped_column(String(100), primary_key=True)
    price_per_hour: Mapped[float] = mapped_column(Float)
