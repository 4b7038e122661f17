"""Lease expiry (invariants 3 and 4): decided by the database's clock alone."""

from __future__ import annotations

import uuid
from collections import defaultdict

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from server.db import is_postgres
from server.db_types import db_now
from server.evals import service as evals
from server.leases import queue
from server.models import Lease, PromptRow


def sweep_expired(session: Session, *, limit: int = 500) -> int:
    """Mark active leases whose expires_at <= db_now() `expired` and re-queue their rows at the
    front (reason `expired`, counting an attempt). Returns the number of leases expired.

    Safe to run concurrently: leases another sweep (or a fenced call) holds are skipped
    (`FOR UPDATE SKIP LOCKED` on Postgres; SQLite has one writer), and runs are processed in id
    order so two sweeps never wait on each other's run rows.
    """
    stmt = (
        select(Lease.id)
        .where(Lease.state == "active", Lease.expires_at <= db_now())
        .order_by(Lease.id)
        .limit(limit)
    )
    if is_postgres(session):
        stmt = stmt.with_for_update(skip_locked=True)
    candidates = list(session.execute(stmt).scalars())
    if not candidates:
        return 0
    expired = session.execute(
        update(Lease)
        .where(
            Lease.id.in_(candidates),
            Lease.state == "active",
            Lease.expires_at <= db_now(),
        )
        .values(state="expired", ended_at=db_now(), end_reason="expired")
        .returning(Lease.id, Lease.run_id)
        .execution_options(synchronize_session=False)
    ).all()
    # eval leases' items go back to their own queue (an attempt counted)
    evals.requeue_leases(session, [lease_id for lease_id, _run in expired], count_attempt=True)
    by_run: dict[uuid.UUID, list[uuid.UUID]] = defaultdict(list)
    for lease_id, run_id in expired:
        by_run[run_id].append(lease_id)
    for run_id in sorted(by_run):
        row_ids = list(
            session.execute(
                select(PromptRow.id).where(
                    PromptRow.lease_id.in_(by_run[run_id]), PromptRow.state == "leased"
                )
            ).scalars()
        )
        queue.requeue(session, run_id, row_ids, "expired", count_attempt=True)
    return len(expired)
