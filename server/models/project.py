"""A project: one team's runs, sweeps and datasets on a shared control plane
(server/projects/; docs/guides/projects.md). Workers, pool learners and registration tokens
with a project serve only its runs; with none (NULL) they are the shared fleet and serve every
project."""

from __future__ import annotations

import uuid

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from server.models.base import Base, CreatedAt, UUIDPk

# The project that migration 0014 creates and puts every earlier run, sweep and dataset in;
# a run, sweep or dataset created without a project goes there.
DEFAULT_PROJECT_ID = uuid.UUID("00000000-0000-0000-0000-00000000d3fa")


class Project(UUIDPk, CreatedAt, Base):
    __tablename__ = "projects"

    name: Mapped[str] = mapped_column(String(63), unique=True)
