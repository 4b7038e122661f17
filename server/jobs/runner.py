"""The one implementation of each job, as a function of a JobContext. Celery tasks
(server/jobs/tasks.py) and the embedded in-process scheduler (server/jobs/inprocess.py) both
call these. Each job runs in its own transaction(s); follow-up work (webhook delivery after an
alarm, budget enforcement after cost accrual) is requested only after the commit."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from protocol.storage import ObjectStore
from server.audit import service as audit
from server.config import Settings
from server.datasets.jobs import check_pending
from server.db import transaction
from server.events import webhooks
from server.idempotency import store as idempotency
from server.jobs import alarms, budgets, costs, retention
from server.leases.expiry import sweep_expired, sweep_revoked
from server.runs.prepare import prepare_runs as prepare

log = logging.getLogger("asyncgrpo.jobs")


@dataclass
class JobContext:
    """What a job needs: settings, a session factory, the object store, and how to request a
    follow-up job once the current transaction has committed."""

    settings: Settings
    factory: sessionmaker[Session]
    store_factory: Callable[[], ObjectStore]
    follow_up: Callable[[str], None] = field(default=lambda name: None)
    _store: ObjectStore | None = None

    @property
    def store(self) -> ObjectStore:
        if self._store is None:
            self._store = self.store_factory()
        return self._store


def sweep(ctx: JobContext) -> int:
    with transaction(ctx.factory) as session:
        return sweep_expired(session) + sweep_revoked(session)


def accrue(ctx: JobContext) -> float:
    with transaction(ctx.factory) as session:
        usd = costs.accrue_costs(session, silent_s=ctx.settings.jobs.worker_silent_s)
    if usd > 0:
        ctx.follow_up("budgets")
    return usd


def enforce(ctx: JobContext) -> int:
    with transaction(ctx.factory) as session:
        exhausted = budgets.enforce_budgets(session)
    if exhausted:
        ctx.follow_up("webhooks")
    return len(exhausted)


def evaluate(ctx: JobContext) -> int:
    with transaction(ctx.factory) as session:
        crossings = alarms.evaluate_alarms(session)
    if crossings:
        ctx.follow_up("webhooks")
    return len(crossings)


def deliver(ctx: JobContext) -> dict[str, int]:
    jobs = ctx.settings.jobs
    return webhooks.deliver_due(
        ctx.factory,
        secret=ctx.settings.secret_key(),
        max_attempts=jobs.webhook_max_attempts,
        backoff_s=jobs.webhook_backoff_s,
        timeout_s=jobs.webhook_timeout_s,
        policy=ctx.settings.outbound_policy(),
    )


def check_datasets(ctx: JobContext) -> int:
    changed = check_pending(ctx.factory, ctx.store, ctx.settings.datasets)
    if changed:
        ctx.follow_up("run_prep")
    return changed


def prepare_runs(ctx: JobContext) -> int:
    return prepare(ctx.factory, ctx.store, ctx.settings.datasets)


def forget_idempotent_answers(ctx: JobContext) -> int:
    """Answers kept past `idempotency_retention_s` deleted (their keys refused from then on)."""
    with transaction(ctx.factory) as session:
        return idempotency.purge(session, ctx.settings.idempotency_retention_s)


def forget_old_audit_entries(ctx: JobContext) -> int:
    """Audit entries older than `audit.retention_days` deleted."""
    with transaction(ctx.factory) as session:
        return audit.purge(session, ctx.settings.audit.retention_days)


def retain(ctx: JobContext) -> int:
    deleted = retention.apply_all(ctx.factory, ctx.store)
    return sum(len(keys) for keys in deleted.values())


JOBS: dict[str, Callable[[JobContext], Any]] = {
    "sweep": sweep,
    "costs": accrue,
    "budgets": enforce,
    "alarms": evaluate,
    "webhooks": deliver,
    "retention": retain,
    "idempotency": forget_idempotent_answers,
    "audit": forget_old_audit_entries,
    "datasets": check_datasets,
    "run_prep": prepare_runs,
}


def intervals(settings: Settings) -> dict[str, float]:
    """Seconds between two runs of each job."""
    jobs = settings.jobs
    return {
        "sweep": jobs.sweep_interval_s,
        "costs": jobs.cost_interval_s,
        "budgets": jobs.budget_interval_s,
        "alarms": jobs.alarm_interval_s,
        "webhooks": jobs.webhook_interval_s,
        "retention": jobs.retention_interval_s,
        "idempotency": jobs.retention_interval_s,
        "audit": jobs.retention_interval_s,
        "datasets": jobs.datasets_interval_s,
        "run_prep": jobs.datasets_interval_s,
    }


def run_job(name: str, ctx: JobContext) -> Any:
    result = JOBS[name](ctx)
    log.debug("job %s: %s", name, result)
    return result
