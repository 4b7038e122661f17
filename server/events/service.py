"""Events: what happened to a run or a worker (alarms, budgets, quarantines, failures), shown on
the dashboard and delivered to the run's webhook. Every event is raised here."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy.orm import Session

from server.events import repository, webhooks
from server.models import Event

# `info` events delivered to the run's webhook all the same: results a pipeline waits for.
WEBHOOK_INFO_KINDS = frozenset({"eval.scored", "run.early_stop"})


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
    """Insert an Event and queue a signed delivery to the run's webhook, if it has one.
    `info` events (publishes, attaches, status changes by an admin) are shown on the dashboard
    only: the webhook is for alarms and failures, and for the info kinds in WEBHOOK_INFO_KINDS
    (each evaluated version's results)."""
    event = repository.insert(
        session,
        run_id=run_id,
        worker_id=worker_id,
        kind=kind,
        severity=severity,
        message=message,
        data=data or {},
    )
    if run_id is not None and (severity != "info" or kind in WEBHOOK_INFO_KINDS):
        url = repository.webhook_url(session, run_id)
        if url:
            webhooks.enqueue(session, event, url)
    return event
