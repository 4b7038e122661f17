"""All SQL of events."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from server.models import Event, Run


def insert(session: Session, **fields: Any) -> Event:
    event = Event(**fields)
    session.add(event)
    session.flush()
    return event


def webhook_url(session: Session, run_id: uuid.UUID) -> str | None:
    """The run's stored `alarms.webhook_url` (normalised when the run was created, and what
    deliveries use), read as one JSON field: the config's other parts (a large inline dataset)
    are not loaded, and events need no parsed config (server/runs sits above events)."""
    alarms = session.execute(
        select(Run.config["alarms"]).where(Run.id == run_id)
    ).scalar_one_or_none()
    url = alarms.get("webhook_url") if isinstance(alarms, dict) else None
    return url if isinstance(url, str) else None
