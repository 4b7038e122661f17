"""Leases the server ends without their worker: expiry (invariants 3 and 4), decided by the
database's clock alone, and the revocation of their worker."""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Sequence

from sqlalchemy import ColumnElement, Row, select, update
from sqlalchemy.orm import Session

from server.db import is_postgres
from server.db_types import db_now
from server.leases.ledger import kind_of
from server.models import Lease, Worker
from server.runs.waste import REVOKED  # the end reason of a revoked worker's leases


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
        .returning(Lease.id, Lease.run_id, Lease.kind)
        .execution_options(synchronize_session=False)
    ).all()
    _requeue_ended(session, expired, "expired", count_attempt=True)
    return len(expired)


def end_revoked_worker_leases(session: Session, worker_id: uuid.UUID) -> int:
    """End every active lease of a worker being revoked `aborted` (end_reason `revoked`) and
    put their prompt rows (and eval items) back at the front of their queues at once, no
    attempt counted: the prompts did nothing wrong, and another worker may lease them now
    rather than when the TTL runs out. Returns the number of leases ended.

    Called before the worker row is updated, so that the locks are taken in the grant's order
    (lease and prompt rows, run row, worker row)."""
    return _end_revoked(session, Lease.worker_id == worker_id)


def sweep_revoked(session: Session, *, limit: int = 500) -> int:
    """End as `end_revoked_worker_leases` does the active leases of workers already revoked: a
    grant that committed while its worker was being revoked (it read the worker active). The
    sweep job runs it; leases another sweep holds are skipped, as in `sweep_expired`."""
    stmt = (
        select(Lease.id)
        .join(Worker, Worker.id == Lease.worker_id)
        .where(Lease.state == "active", Worker.status == "revoked")
        .order_by(Lease.id)
        .limit(limit)
    )
    if is_postgres(session):
        stmt = stmt.with_for_update(of=Lease, skip_locked=True)
    candidates = list(session.execute(stmt).scalars())
    return _end_revoked(session, Lease.id.in_(candidates)) if candidates else 0


def _end_revoked(session: Session, which: ColumnElement[bool]) -> int:
    ended = session.execute(
        update(Lease)
        .where(which, Lease.state == "active")
        .values(state="aborted", ended_at=db_now(), end_reason=REVOKED)
        .returning(Lease.id, Lease.run_id, Lease.kind)
        .execution_options(synchronize_session=False)
    ).all()
    _requeue_ended(session, ended, REVOKED, count_attempt=False)
    return len(ended)


def _requeue_ended(
    session: Session,
    ended: Sequence[Row[uuid.UUID, uuid.UUID, str]],
    reason: str,
    *,
    count_attempt: bool,
) -> None:
    """The rows still out under these just-ended leases (lease id, run id, kind) back to the
    front of their queue with `reason`, each by its kind (server/leases/ledger.py); runs in id
    order, so two callers never wait on each other's runs."""
    by_run: dict[tuple[uuid.UUID, str], list[uuid.UUID]] = defaultdict(list)
    for lease_id, run_id, kind in ended:
        by_run[(run_id, kind)].append(lease_id)
    for run_id, kind in sorted(by_run):
        kind_of(kind).requeue(
            session, run_id, by_run[(run_id, kind)], reason, count_attempt=count_attempt
        )
