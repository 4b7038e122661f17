"""All SQL of the pool learners: their rows, the runs they hold, and the take's one
compare-and-set per run (database time; nothing here commits). The rules of a run's learner
(which learner fits a run, a free lease, a live hold) are server/learner/repository.py's."""

from __future__ import annotations

import uuid
from collections import defaultdict
from typing import Any

from sqlalchemy import Uuid, literal, select, update
from sqlalchemy.orm import Session

from server.db_types import db_now, db_now_plus
from server.learner.repository import (
    ATTACHABLE_STATUSES,
    held_by_pool,
    learner_fits,
    lease_free,
    pool_hold_free,
    pool_live,
)
from server.models import PoolLearner, Run
from server.projects.fleet import serves

# A run that needs a learner: one a learner may attach to (pending, running, evaluating, paused)
# with no live learner lease (`lease_free`), but not one whose budget is spent: it has no work
# until its budget is raised, and would hold a slot meanwhile.
TAKEABLE_STATUSES = ATTACHABLE_STATUSES - {"budget_exhausted"}
_NO_SYNC = {"synchronize_session": False}


def insert(session: Session, **fields: Any) -> PoolLearner:
    learner = PoolLearner(**fields)
    session.add(learner)
    session.flush()
    return learner


def get(session: Session, learner_id: uuid.UUID) -> PoolLearner | None:
    return session.get(PoolLearner, learner_id)


def lock_live(session: Session, learner_id: uuid.UUID) -> PoolLearner | None:
    """The pool learner's row, unrevoked, locked for the take (FOR UPDATE: two takes of one
    pool learner count its held runs one after the other; SQLite serialises writers)."""
    return session.execute(
        select(PoolLearner)
        .where(PoolLearner.id == learner_id, PoolLearner.revoked_at.is_(None))
        .with_for_update()
    ).scalar_one_or_none()


def list_all(session: Session) -> list[PoolLearner]:
    return list(
        session.execute(select(PoolLearner).order_by(PoolLearner.created_at.desc())).scalars()
    )


def held_runs(session: Session, learner_id: uuid.UUID) -> list[uuid.UUID]:
    """The runs the pool learner holds now (its take's hold or its learner lease live)."""
    return list(
        session.execute(
            select(Run.id).where(held_by_pool(learner_id)).order_by(Run.created_at, Run.id)
        ).scalars()
    )


def held_by_each(session: Session) -> dict[uuid.UUID, list[uuid.UUID]]:
    """Every pool learner's held runs, in one read."""
    rows = session.execute(
        select(Run.pool_learner_id, Run.id)
        .where(Run.pool_learner_id.is_not(None), pool_live())
        .order_by(Run.created_at, Run.id)
    ).all()
    out: dict[uuid.UUID, list[uuid.UUID]] = defaultdict(list)
    for learner_id, run_id in rows:
        if learner_id is not None:
            out[learner_id].append(run_id)
    return dict(out)


def _takeable(learner: PoolLearner) -> list[Any]:
    """A run this pool learner may take: it needs a learner, fits the learner's model and
    tokenizer, and is of a project the learner serves (server/projects/fleet.py)."""
    return [
        Run.status.in_(TAKEABLE_STATUSES),
        learner_fits(learner.model, learner.tokenizer_fingerprint),
        serves(literal(learner.project_id, Uuid), Run.project_id),
        lease_free(),
        pool_hold_free(),
    ]


def candidates(session: Session, learner: PoolLearner, limit: int) -> list[uuid.UUID]:
    """Runs the pool learner could take now, oldest first (each still only a candidate: the
    compare-and-set decides)."""
    return list(
        session.execute(
            select(Run.id).where(*_takeable(learner)).order_by(Run.created_at, Run.id).limit(limit)
        ).scalars()
    )


def take_one(session: Session, learner: PoolLearner, run_id: uuid.UUID, hold_s: float) -> bool:
    """The one compare-and-set of a take: the run becomes this pool learner's, held for
    `hold_s` until its attach, only if it is still takeable (no live learner lease, no other
    pool learner's live hold, the model and fingerprint fit); False when another got it."""
    row = session.execute(
        update(Run)
        .where(Run.id == run_id, *_takeable(learner))
        .values(
            pool_learner_id=learner.id, pool_held_until=db_now_plus(hold_s), updated_at=db_now()
        )
        .returning(Run.id)
        .execution_options(**_NO_SYNC)
    ).first()
    return row is not None


def taken(session: Session, run_ids: list[uuid.UUID]) -> list[Run]:
    if not run_ids:
        return []
    rows = session.execute(
        select(Run).where(Run.id.in_(run_ids)).execution_options(populate_existing=True)
    ).scalars()
    by_id = {run.id: run for run in rows}
    return [by_id[i] for i in run_ids]


def revoke(session: Session, learner_id: uuid.UUID) -> bool:
    """Mark it revoked (False when it already was)."""
    row = session.execute(
        update(PoolLearner)
        .where(PoolLearner.id == learner_id, PoolLearner.revoked_at.is_(None))
        .values(revoked_at=db_now())
        .returning(PoolLearner.id)
        .execution_options(**_NO_SYNC)
    ).first()
    return row is not None


def release_runs(session: Session, learner_id: uuid.UUID) -> int:
    """Its held runs become takeable: their learner leases end now (database time), the hold
    and the run's pool learner cleared. Their claimed batches go back at the next attach."""
    session.execute(
        update(Run)
        .where(Run.pool_learner_id == learner_id, Run.learner_expires_at > db_now())
        .values(learner_expires_at=db_now())
        .execution_options(**_NO_SYNC)
    )
    result = session.execute(
        update(Run)
        .where(Run.pool_learner_id == learner_id)
        .values(pool_learner_id=None, pool_held_until=None, updated_at=db_now())
        .returning(Run.id)
        .execution_options(**_NO_SYNC)
    )
    return len(result.all())
