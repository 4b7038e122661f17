"""All SQL of events."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from server.models import Event


def insert(session: Session, **fields: Any) -> Event:
    event = Event(**fields)
    session.add(event)
    session.flush()
    return event
