"""Budget enforcement: a run whose spend reached its budget_usd moves to `budget_exhausted`
(with an Event). The lease engine leases only `running` runs, so it hands out no more leases."""

from __future__ import annotations

import uuid

from sqlalchemy import select
from sqlalchemy.orm import Session

from server.events.service import raise_event
from server.models import Run
from server.runs import lifecycle
from server.runs.repository import config_number

ENFORCED_STATUSES = sorted(lifecycle.TRANSITIONS["budget"].from_states)


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
        reason = f"spent ${float(spent):.2f} of its ${float(budget):.2f} budget"
        if not lifecycle.move(session, run_id, "budget", reason, Run.spent_usd >= float(budget)):
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
