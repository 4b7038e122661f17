"""The one row naming this database and the bucket it serves (server/installation.py)."""

from __future__ import annotations

import uuid

from sqlalchemy import Integer, String, Uuid
from sqlalchemy.orm import Mapped, mapped_column

from server.models.base import Base


class Installation(Base):
    """The database's id, also written into the bucket's marker object, and the bucket URL the
    first server started with; processes on another bucket refuse to start."""

    __tablename__ = "installation"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)  # always 1
    database_id: Mapped[uuid.UUID] = mapped_column(Uuid)
    bucket_url: Mapped[str] = mapped_column(String(2000))
