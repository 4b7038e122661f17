"""A sweep: runs made at once from one base config and a grid (or a list) of overrides
(server/sweeps/service.py); each of its runs names it in `runs.sweep_id`."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import ForeignKey, Integer, String, Uuid
from sqlalchemy.orm import Mapped, mapped_column, relationship

from server.db_types import JSONType
from server.models.base import Base, CreatedAt, UUIDPk
from server.models.project import DEFAULT_PROJECT_ID, Project


class Sweep(UUIDPk, CreatedAt, Base):
    __tablename__ = "sweeps"

    name: Mapped[str] = mapped_column(String(200))
    # The base config as posted (its runs' configs are stored, validated, on each run);
    # deferred: an inline dataset makes it large.
    base_config: Mapped[dict[str, Any]] = mapped_column(JSONType, deferred=True)
    # The grid as posted (field path -> values); None when the sweep listed its overrides.
    grid: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    n_runs: Mapped[int] = mapped_column(Integer)
    # Its project (server/projects/); the default project when created without one.
    project_id: Mapped[uuid.UUID] = mapped_column(
        Uuid, ForeignKey("projects.id", ondelete="RESTRICT"), index=True, default=DEFAULT_PROJECT_ID
    )
    project: Mapped[Project] = relationship(lazy="select")
    # The admin or project token that created it (a `ci` token may pause and cancel only the
    # runs it created: server/tokens/roles.py); None for one created before revision 0015.
    created_by_token_id: Mapped[uuid.UUID | None] = mapped_column(
        Uuid, ForeignKey("tokens.id", ondelete="SET NULL"), index=True
    )
