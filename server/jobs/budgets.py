"""Budget enforcement: a run whose spend reached its budget_usd moves to `budget_exhausted`
(with an Event). The lease engine leases only `running` runs, so it hands out no more leases."""

from __future__ import annotations

import uuid

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from server.db_types import db_now
from server.jobs.common import raise_event
from server.models import Run
from server.runs.repository import config_number

ENFORCED_STATUSES = ("pending", "running", "paused")


def enforce_budgets(session: Session) -> list[uuid.UUID]:
    """Move every run at or over its budget to `budget_exhausted`; returns their ids. The
    status change is a compare-and-set, so a repeated pass raises no second event."""
    rows = session.execute(
        select(Run.id, Run.spent_usd, config_number("budget_usd")).where(
            Run.status.in_(ENFORCED_STATUSES)
        )
    ).all()
    exhausted: list[uuid.UUID] = []
    for run_id, spent, budget in rows:
        if budget is None or float(spent) < float(budget):
            continue
        moved = session.execute(
            update(Run)
            .where(
                Run.id == run_id,
                Run.status.in_(ENFORCED_STATUSES),
                Run.spent_usd >= float(budget),
            )
            .values(
                status="budget_exhausted",
                status_reason=f"spent ${float(spent):.2f} of its ${float(budget):.2f} budget",
                updated_at=db_now(),
            )
            .returning(Run.id)
        ).first()
        if moved is None:
            continue
        raise_event(
            session,
            kind="run.budget_exhausted",
            severity="warning",
            message=f"budget exhausted: spent ${float(spent):.2f} of ${float(budget):.2f}",
            run_id=run_id,
            data={"spent_usd": float(spent), "budget_usd": float(budget)},
        )
        exhausted.append(run_id)
    return exhausted
