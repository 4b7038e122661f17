"""Small helpers the job functions share: database time and events (with their webhooks)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from server.db_types import db_now
from server.jobs import webhooks
from server.models import Event
from server.runs.service import config_of


def db_time(session: Session) -> datetime:
    """The database's current time (jobs never use the local clock)."""
    now: datetime = session.execute(select(db_now())).scalar_one()
    return now


def raise_event(
    session: Session,
    *,
    kind: str,
    message: str,
    run_id: uuid.UUID | None = None,
    worker_id: uuid.UUID | None = None,
    severity: str = "warning",
    data: dict[str, Any] | None = None,
) -> Event:
    """Insert an Event and queue a signed delivery to the run's webhook, if it has one."""
    event = Event(
        run_id=run_id,
        worker_id=worker_id,
        kind=kind,
        severity=severity,
        message=message,
        data=data or {},
    )
    session.add(event)
    session.flush()
    if run_id is not None:
        url = config_of(session, run_id).alarms.webhook_url
        if url:
            webhooks.enqueue(session, event, url)
    return event
