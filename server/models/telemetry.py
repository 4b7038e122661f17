from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Float, ForeignKey, Index, Integer, String, Text, Uuid
from sqlalchemy.orm import Mapped, mapped_column

from server.db_types import BigIntPK, JSONType, UTCDateTime
from server.models.base import Base, CreatedAt


class MetricPoint(CreatedAt, Base):
    """One step of learner metrics, or one interval of proxy metrics."""

    __tablename__ = "metric_points"
    __table_args__ = (Index("ix_metric_points_run_source_step", "run_id", "source", "step"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    run_id: Mapped[uuid.UUID] = mapped_column(Uuid, ForeignKey("runs.id", ondelete="CASCADE"))
    source: Mapped[str] = mapped_column(String(16))  # learner | proxy
    step: Mapped[int] = mapped_column(Integer)
    version: Mapped[int | None] = mapped_column(Integer)
    values: Mapped[dict[str, Any]] = mapped_column(JSONType)


class Event(CreatedAt, Base):
    """Something an operator should see: alarms, quarantines, state changes."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_run_created", "run_id", "created_at"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    run_id: Mapped[uuid.UUID | None] = mapped_column(
        Uuid, ForeignKey("runs.id", ondelete="CASCADE")
    )
    worker_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    kind: Mapped[str] = mapped_column(String(64))
    severity: Mapped[str] = mapped_column(String(16), default="info")
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)


class CostRecord(CreatedAt, Base):
    """Alive-seconds × price, attributed to a run (None: the idle pool)."""

    __tablename__ = "cost_records"
    __table_args__ = (Index("ix_cost_records_run", "run_id"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    run_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    worker_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    lease_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    # A pool learner's time (kind pool_learner; None for the other kinds).
    pool_learner_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    kind: Mapped[str] = mapped_column(String(16))  # worker | learner | pool_learner
    seconds: Mapped[float] = mapped_column(Float)
    usd: Mapped[float] = mapped_column(Float)
    period_start: Mapped[datetime] = mapped_column(UTCDateTime)
    period_end: Mapped[datetime] = mapped_column(UTCDateTime)
