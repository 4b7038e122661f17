"""Tables the background jobs keep: alarm state, cost accrual marks, webhook deliveries."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, Float, Index, Integer, String, Text, UniqueConstraint, Uuid
from sqlalchemy.orm import Mapped, mapped_column

from server.db_types import BigIntPK, JSONType, UTCDateTime
from server.models.base import Base, CreatedAt


class AlarmState(Base):
    """Whether an alarm is raised for a subject (a run, or a worker), so that an alarm raises
    one event per crossing of its threshold and re-arms when it clears."""

    __tablename__ = "alarm_states"
    __table_args__ = (UniqueConstraint("subject_id", "kind", name="uq_alarm_states_subject_kind"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    subject_id: Mapped[uuid.UUID] = mapped_column(Uuid)
    kind: Mapped[str] = mapped_column(String(64))
    active: Mapped[bool] = mapped_column(Boolean, default=False)
    value: Mapped[float | None] = mapped_column(Float)
    changed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class CostMark(Base):
    """How far cost has been accrued for a worker (kind `worker`) or a run's learner
    (kind `learner`, subject = run id)."""

    __tablename__ = "cost_marks"
    __table_args__ = (UniqueConstraint("kind", "subject_id", name="uq_cost_marks_kind_subject"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(16))
    subject_id: Mapped[uuid.UUID] = mapped_column(Uuid)
    marked_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # The subject was silent at the last accrual: its gap is never charged.
    silent: Mapped[bool] = mapped_column(Boolean, default=False)


class WebhookDelivery(CreatedAt, Base):
    """One signed POST of an event to a run's webhook, with its retry state (the delivery log)."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (Index("ix_webhook_deliveries_state_next", "state", "next_attempt_at"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    run_id: Mapped[uuid.UUID | None] = mapped_column(Uuid, index=True)
    event_id: Mapped[int | None] = mapped_column(BigIntPK)
    url: Mapped[str] = mapped_column(String(2000))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONType)
    state: Mapped[str] = mapped_column(String(16), default="pending")  # pending|delivered|failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime)
    last_status: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
