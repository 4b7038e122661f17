"""A pool learner: a learner process that started without a run, registered once with a
registration token, and takes runs that need a learner (server/learners/;
docs/guides/pool-learners.md). A run it holds names it in `runs.pool_learner_id`."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import Float, ForeignKey, Integer, String, Uuid
from sqlalchemy.orm import Mapped, mapped_column, relationship

from server.db_types import UTCDateTime
from server.models.base import Base, CreatedAt, UUIDPk
from server.models.project import Project


class PoolLearner(UUIDPk, CreatedAt, Base):
    __tablename__ = "pool_learners"

    name: Mapped[str] = mapped_column(String(200))
    # The base model (Hub id) and tokenizer fingerprint it loaded: it takes only runs of both.
    model: Mapped[str] = mapped_column(String(500), index=True)
    tokenizer_fingerprint: Mapped[str] = mapped_column(String(128))
    max_runs: Mapped[int] = mapped_column(Integer)
    memory_budget_gb: Mapped[float | None] = mapped_column(Float)
    gpu_type: Mapped[str | None] = mapped_column(String(100))
    # USD/hour as reported at registration; its alive time is split over the runs it holds.
    price_per_hour: Mapped[float | None] = mapped_column(Float)
    # The project it serves (server/projects/); None: the shared fleet, it serves every project.
    project_id: Mapped[uuid.UUID | None] = mapped_column(
        Uuid, ForeignKey("projects.id", ondelete="RESTRICT"), index=True
    )
    # Loaded when read (listings show its name): one query per project in a session.
    project: Mapped[Project | None] = relationship(lazy="select")
    # Its `pool_learner` token (scope_id = this id).
    token_id: Mapped[uuid.UUID | None] = mapped_column(
        Uuid, ForeignKey("tokens.id", ondelete="SET NULL")
    )
    last_seen_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
