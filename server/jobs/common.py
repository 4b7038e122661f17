"""Small helpers the job functions share: database time."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from server.db_types import db_now


def db_time(session: Session) -> datetime:
    """The database's current time (jobs never use the local clock)."""
    now: datetime = session.execute(select(db_now())).scalar_one()
    return now
