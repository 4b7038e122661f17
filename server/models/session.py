from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import ForeignKey, Uuid
from sqlalchemy.orm import Mapped, mapped_column

from server.db_types import UTCDateTime
from server.models.base import Base, CreatedAt, UUIDPk


class DashboardSession(UUIDPk, CreatedAt, Base):
    """One dashboard login. The cookie names the row; logout, revoking the admin token that
    logged in, or "log out everywhere" set revoked_at, which ends it at the next request."""

    __tablename__ = "dashboard_sessions"

    token_id: Mapped[uuid.UUID] = mapped_column(
        Uuid, ForeignKey("tokens.id", ondelete="CASCADE"), index=True
    )
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
