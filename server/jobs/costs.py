"""Cost accrual (docs/architecture/index.md, "Jobs"; invariant 24).

A worker's alive-seconds × its effective price (admin override, then the admin price table
per GPU type, then its self-reported price) are attributed to the run whose lease it held
during each part of the interval; time without a lease goes to the pool (run_id None). A
worker whose last_seen_at is older than `silent_s` is silent: it accrues up to its last contact
and no further, and the gap before it is seen again is never charged. A run's learner accrues
the run's learner_price_per_hour while its learner lease is live (a per-run learner only). A
pool learner's alive-seconds × the price it reported at registration are split, by the same
rule (`attribute`), over the runs whose learner lease it holds during each part of the
interval (docs/guides/pool-learners.md, "Cost"); time holding none goes to the pool. Every
accrual advances a
per-subject mark with a compare-and-set, so a repeated or concurrent accrual charges nothing
twice.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from server.db import db_time
from server.models import CostMark, CostRecord, Lease, PoolLearner, Run, Worker
from server.runs.service import config_of
from server.workers.liveness import is_silent
from server.workers.repository import price_table
from server.workers.service import effective_price


@dataclass(frozen=True)
class Span:
    """A lease's holding interval, for attribution (a worker lease, or a run's learner lease held
    by a pool learner: lease_id None)."""

    lease_id: uuid.UUID | None
    run_id: uuid.UUID
    start: datetime
    end: datetime


def attribute(
    start: datetime, end: datetime, spans: list[Span]
) -> dict[tuple[uuid.UUID | None, uuid.UUID | None], float]:
    """Seconds of [start, end) per (run_id, lease_id); (None, None) is idle time. Time covered
    by several leases at once is split evenly between them."""
    points = {start, end}
    for s in spans:
        points.update(p for p in (s.start, s.end) if start < p < end)
    edges = sorted(points)
    out: dict[tuple[uuid.UUID | None, uuid.UUID | None], float] = defaultdict(float)
    for a, b in zip(edges, edges[1:], strict=False):
        seconds = (b - a).total_seconds()
        holders = [s for s in spans if s.start <= a and s.end >= b]
        if not holders:
            out[(None, None)] += seconds
            continue
        for s in holders:
            out[(s.run_id, s.lease_id)] += seconds / len(holders)
    return dict(out)


def _advance_mark(
    session: Session,
    kind: str,
    subject: uuid.UUID,
    old: datetime | None,
    new: datetime,
    *,
    silent: bool,
) -> bool:
    """Compare-and-set the mark from `old` to `new`; False when another accrual moved it."""
    if old is None:
        try:
            with session.begin_nested():
                session.add(CostMark(kind=kind, subject_id=subject, marked_at=new, silent=silent))
        except IntegrityError:
            return False
        return True
    moved = session.execute(
        update(CostMark)
        .where(CostMark.kind == kind, CostMark.subject_id == subject, CostMark.marked_at == old)
        .values(marked_at=new, silent=silent)
        .returning(CostMark.id)
    ).first()
    return moved is not None


def _marks(session: Session, kind: str) -> dict[uuid.UUID, CostMark]:
    rows = session.execute(select(CostMark).where(CostMark.kind == kind)).scalars()
    return {m.subject_id: m for m in rows}


def _charge(
    session: Session,
    *,
    kind: str,
    run_id: uuid.UUID | None,
    worker_id: uuid.UUID | None,
    lease_id: uuid.UUID | None,
    seconds: float,
    price_per_hour: float,
    start: datetime,
    end: datetime,
    pool_learner_id: uuid.UUID | None = None,
) -> float:
    usd = seconds * price_per_hour / 3600.0
    session.add(
        CostRecord(
            run_id=run_id,
            worker_id=worker_id,
            pool_learner_id=pool_learner_id,
            lease_id=lease_id,
            kind=kind,
            seconds=seconds,
            usd=usd,
            period_start=start,
            period_end=end,
        )
    )
    if run_id is not None and usd:
        session.execute(update(Run).where(Run.id == run_id).values(spent_usd=Run.spent_usd + usd))
    return usd


def _lease_spans(
    session: Session, worker_id: uuid.UUID, start: datetime, end: datetime
) -> list[Span]:
    leases = session.execute(
        select(Lease).where(
            Lease.worker_id == worker_id,
            Lease.created_at < end,
            or_(Lease.ended_at.is_(None), Lease.ended_at > start),
        )
    ).scalars()
    spans = []
    for lease in leases:
        # An active lease is held until it expires (the sweep may not have run yet).
        stop = min(lease.ended_at or lease.expires_at, end)
        if stop > lease.created_at:
            spans.append(Span(lease.id, lease.run_id, max(lease.created_at, start), stop))
    return spans


def _alive_window(
    session: Session,
    kind: str,
    subject_id: uuid.UUID,
    marks: dict[uuid.UUID, CostMark],
    created_at: datetime,
    last_seen_at: datetime,
    now: datetime,
    silent: bool,
) -> tuple[datetime, datetime] | None:
    """The next [start, end) of a worker's or pool learner's alive time to charge, its mark
    advanced to `end` by compare-and-set; None when nothing is to be charged (no time passed,
    or a concurrent accrual advanced the mark first). A silent subject accrues up to its last
    contact; the gap before it is seen again is never charged."""
    mark = marks.get(subject_id)
    start = mark.marked_at if mark else created_at
    end = last_seen_at if silent else now
    if mark is not None and mark.silent:
        start = max(start, end)  # back from (or still in) silence: the gap is not charged
    end = max(end, start)
    if mark is not None and end == mark.marked_at and silent == mark.silent:
        return None
    old = mark.marked_at if mark else None
    if not _advance_mark(session, kind, subject_id, old, end, silent=silent):
        return None
    return (start, end) if end > start else None


def accrue_workers(session: Session, *, silent_s: float) -> float:
    """Accrue every worker's alive time since its mark; returns the USD charged."""
    now = db_time(session)
    table = price_table(session)
    marks = _marks(session, "worker")
    total = 0.0
    for worker in session.execute(select(Worker).where(Worker.last_seen_at.is_not(None))).scalars():
        assert worker.last_seen_at is not None
        silent = is_silent(worker.last_seen_at, now, silent_s)
        window = _alive_window(
            session, "worker", worker.id, marks, worker.created_at, worker.last_seen_at, now, silent
        )
        if window is None:
            continue
        start, end = window
        price = effective_price(worker, table)
        for (run_id, lease_id), seconds in attribute(
            start, end, _lease_spans(session, worker.id, start, end)
        ).items():
            total += _charge(
                session,
                kind="worker",
                run_id=run_id,
                worker_id=worker.id,
                lease_id=lease_id,
                seconds=seconds,
                price_per_hour=price,
                start=start,
                end=end,
            )
    return total


def accrue_learners(session: Session) -> float:
    """Accrue each run's learner time (while its learner lease is live) × learner price."""
    now = db_time(session)
    marks = _marks(session, "learner")
    total = 0.0
    runs = session.execute(
        select(Run).where(
            Run.learner_attached_at.is_not(None),
            Run.learner_expires_at.is_not(None),
            Run.pool_learner_id.is_(None),  # a pool learner's time: accrue_pool_learners
        )
    ).scalars()
    for run in runs:
        assert run.learner_attached_at is not None and run.learner_expires_at is not None
        mark = marks.get(run.id)
        start = max(mark.marked_at, run.learner_attached_at) if mark else run.learner_attached_at
        end = max(min(now, run.learner_expires_at), start)
        if mark and end == mark.marked_at:
            continue
        if not _advance_mark(
            session, "learner", run.id, mark.marked_at if mark else None, end, silent=False
        ):
            continue
        price = config_of(session, run.id).learner_price_per_hour
        if end > start:
            total += _charge(
                session,
                kind="learner",
                run_id=run.id,
                worker_id=None,
                lease_id=None,
                seconds=(end - start).total_seconds(),
                price_per_hour=price,
                start=start,
                end=end,
            )
    return total


def _learner_lease_spans(
    session: Session, pool_learner_id: uuid.UUID, start: datetime, end: datetime
) -> list[Span]:
    """The learner leases of the runs the pool learner holds, within [start, end)."""
    runs = session.execute(
        select(Run.id, Run.learner_attached_at, Run.learner_expires_at).where(
            Run.pool_learner_id == pool_learner_id,
            Run.learner_attached_at.is_not(None),
            Run.learner_expires_at.is_not(None),
        )
    ).all()
    spans = []
    for run_id, attached, expires in runs:
        assert attached is not None and expires is not None
        begin, stop = max(attached, start), min(expires, end)
        if stop > begin:
            spans.append(Span(None, run_id, begin, stop))
    return spans


def accrue_pool_learners(session: Session, *, silent_s: float) -> float:
    """Accrue every pool learner's alive time since its mark (silence as for workers, none after
    its revocation), split over the learner leases it held (`attribute`); returns the USD."""
    now = db_time(session)
    marks = _marks(session, "pool_learner")
    total = 0.0
    learners = session.execute(select(PoolLearner).where(PoolLearner.last_seen_at.is_not(None)))
    for learner in learners.scalars():
        assert learner.last_seen_at is not None
        silent = is_silent(learner.last_seen_at, now, silent_s) or learner.revoked_at is not None
        window = _alive_window(
            session,
            "pool_learner",
            learner.id,
            marks,
            learner.created_at,
            learner.last_seen_at,
            now,
            silent,
        )
        if window is None:
            continue
        start, end = window
        for (run_id, _lease), seconds in attribute(
            start, end, _learner_lease_spans(session, learner.id, start, end)
        ).items():
            total += _charge(
                session,
                kind="pool_learner",
                run_id=run_id,
                worker_id=None,
                lease_id=None,
                seconds=seconds,
                price_per_hour=learner.price_per_hour or 0.0,
                start=start,
                end=end,
                pool_learner_id=learner.id,
            )
    return total


def accrue_costs(session: Session, *, silent_s: float = 60.0) -> float:
    """The cost job: workers, per-run learners and pool learners. Returns the USD charged in
    this pass."""
    return (
        accrue_workers(session, silent_s=silent_s)
        + accrue_learners(session)
        + accrue_pool_learners(session, silent_s=silent_s)
    )
