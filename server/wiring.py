"""The composition root's hooks (docs/architecture/index.md, "Feature order"): where a rule of a
lower feature needs code of a higher one, the lower feature names a hook and `wire` fills it. Called
by create_app (server/app.py) and by the Celery process's job context (server/jobs/tasks.py); the
tests call it in tests/conftest.py. A hook not filled raises at its first use instead of skipping
the rule."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from sqlalchemy.orm import Session

from server.evals import repository as evals_repo
from server.evals import service as evals
from server.evals.ledger import EVAL
from server.learner import repository as learner_repo
from server.leases import expiry, ledger, queue
from server.leases import repository as leases_repo
from server.models import Lease
from server.projects import service as projects
from server.runs import lifecycle, waste
from server.runs import service as runs
from server.tokens import service as tokens
from server.workers import service as workers


def close_ledger(session: Session, run_id: uuid.UUID, reason: str, kind: str | None) -> None:
    """A run's ledger closed (invariant 12): its unfinished prompt rows dropped with `reason`
    (leaving the admission counter), its unconsumed batches rejected and its active leases
    aborted (of `kind` only, when given; the rows of every kind)."""
    queue.drop_unfinished(session, run_id, reason)
    learner_repo.reject_unconsumed(session, run_id, reason, kind=kind)
    only = None if kind is None else ledger.of_kind(Lease.kind, kind)
    leases_repo.abort_active(session, run_id, reason, only=only)


def write_eval_rows(
    session: Session,
    run_id: uuid.UUID,
    rows: Iterable[tuple[Any, dict[str, Any]]],
    replace: bool,
) -> int:
    if replace:
        evals_repo.delete_rows(session, run_id)
    return evals.insert_eval_rows(session, run_id, rows)


def wire() -> None:
    """Fill every hook (idempotent)."""
    lifecycle.close_ledger_with(close_ledger)
    runs.store_eval_rows_with(write_eval_rows)
    workers.end_leases_with(expiry.end_revoked_worker_leases)
    ledger.register(EVAL)
    waste.count_batches_with(ledger.trained)
    tokens.resolve_projects_with(projects.resolve_within)
