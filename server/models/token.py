from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import ForeignKey, Integer, String, Uuid
from sqlalchemy.orm import Mapped, mapped_column, relationship

from server.db_types import UTCDateTime
from server.models.base import Base, CreatedAt, UUIDPk
from server.models.project import Project


class Token(UUIDPk, CreatedAt, Base):
    """An API token, stored only as its SHA-256 digest."""

    __tablename__ = "tokens"

    # admin|project|registration|worker|learner|pool_learner
    kind: Mapped[str] = mapped_column(String(16))
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(24))  # shown in listings, e.g. agr_wkr_ab12
    name: Mapped[str | None] = mapped_column(String(200))
    # learner: the run id; worker: the worker id; pool_learner: the pool learner id;
    # registration/admin: None
    scope_id: Mapped[uuid.UUID | None] = mapped_column(Uuid, index=True)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    max_uses: Mapped[int | None] = mapped_column(Integer)
    uses: Mapped[int] = mapped_column(Integer, default=0)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # A registration token's project, given to the workers and pool learners it registers
    # (server/projects/); None: a shared token, they join the shared fleet. A project token's
    # project: the one it acts in.
    project_id: Mapped[uuid.UUID | None] = mapped_column(
        Uuid, ForeignKey("projects.id", ondelete="RESTRICT"), index=True
    )
    # Loaded when read (listings show its name): one query per project in a session.
    project: Mapped[Project | None] = relationship(lazy="select")
    # A project token's role (server/tokens/roles.py: owner, member, ci, viewer); None for every
    # other kind (an admin token acts in every project).
    role: Mapped[str | None] = mapped_column(String(16))
