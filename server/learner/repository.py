"""All SQL of the learner side of the rollout proxy (runs' learner lease, batch claims,
adapter versions, learner metrics, spot checks). Compare-and-set updates, database time only;
nothing here commits."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, and_, func, or_, select, update
from sqlalchemy.orm import Session, defer

from protocol.schemas import RUN_STATUSES, TERMINAL_RUN_STATUSES
from server.db_types import db_now, db_now_plus
from server.leases import ledger
from server.leases.ledger import KINDS
from server.models import (
    AdapterVersion,
    DatasetRow,
    Lease,
    MetricPoint,
    PoolLearner,
    PromptRow,
    RolloutBatch,
    Run,
)
from server.runs.repository import NEXT_FENCING

OPEN_ROW_STATES = ("queued", "leased", "accepted")
_NO_SYNC = {"synchronize_session": False}


@dataclass(frozen=True)
class FencedRun:
    """The run as a successful fenced compare-and-set left it."""

    id: uuid.UUID
    status: str
    current_version: int
    learner_fencing: int


_FENCED_COLUMNS = (Run.id, Run.status, Run.current_version, Run.learner_fencing)


def _fenced(row: Any) -> FencedRun | None:
    return None if row is None else FencedRun(*row)


def run_with_deferred_config(session: Session, run_id: uuid.UUID) -> Run | None:
    """The run row without loading its (possibly large) config until it is read."""
    return session.get(Run, run_id, options=[defer(Run.config)])


def get_run(session: Session, run_id: uuid.UUID) -> Run | None:
    return session.execute(
        select(Run).where(Run.id == run_id).execution_options(populate_existing=True)
    ).scalar_one_or_none()


# A learner may attach to a run in these: it has not ended, and its prompt rows are prepared.
ATTACHABLE_STATUSES = frozenset(RUN_STATUSES) - TERMINAL_RUN_STATUSES - {"preparing"}


def lease_free() -> ColumnElement[bool]:
    """No learner holds a live lease on the run (never attached, or expired)."""
    return or_(Run.learner_expires_at.is_(None), Run.learner_expires_at <= db_now())


def fingerprint_fits(fingerprint: str) -> ColumnElement[bool]:
    """The run's tokenizer fingerprint is unset (fixed by the first attach) or this one."""
    return or_(Run.tokenizer_fingerprint.is_(None), Run.tokenizer_fingerprint == fingerprint)


def learner_fits(model: str, fingerprint: str) -> ColumnElement[bool]:
    """A learner that loaded `model` with a tokenizer of `fingerprint` can train the run: the
    one rule of attach (its model check, `service._refuse_another_model`, and its
    compare-and-set's fingerprint_fits) and of a pool learner's take (server/learners/)."""
    return and_(Run.base_model == model, fingerprint_fits(fingerprint))


def pool_hold_free() -> ColumnElement[bool]:
    """No pool learner's take holds the run before its attach (none, or its hold lapsed)."""
    return or_(
        Run.pool_learner_id.is_(None),
        Run.pool_held_until.is_(None),
        Run.pool_held_until <= db_now(),
    )


def held_by_pool(pool_learner_id: uuid.UUID) -> ColumnElement[bool]:
    """The pool learner holds the run now: its take's hold or its learner lease is live, and
    the run has not ended (an ended run frees its slot at once)."""
    return and_(Run.pool_learner_id == pool_learner_id, pool_live())


def pool_live() -> ColumnElement[bool]:
    """The run's pool learner (if any) holds it now (see held_by_pool)."""
    return and_(
        Run.status.not_in(TERMINAL_RUN_STATUSES),
        or_(Run.learner_expires_at > db_now(), Run.pool_held_until > db_now()),
    )


def pool_holder(session: Session, run_id: uuid.UUID) -> tuple[bool, uuid.UUID | None]:
    """(whether the run exists, its pool learner or None)."""
    row = session.execute(select(Run.pool_learner_id).where(Run.id == run_id)).first()
    return (False, None) if row is None else (True, row[0])


def touch_pool_learner(session: Session, pool_learner_id: uuid.UUID) -> None:
    """The pool learner was seen now (database time): on a take and a held run's heartbeat."""
    session.execute(
        update(PoolLearner)
        .where(PoolLearner.id == pool_learner_id)
        .values(last_seen_at=db_now())
        .execution_options(**_NO_SYNC)
    )


def attach(
    session: Session,
    run_id: uuid.UUID,
    fingerprint: str,
    ttl_s: float,
    *,
    pool_learner_id: uuid.UUID | None = None,
) -> FencedRun | None:
    """Take the learner lease if none is live: a strictly higher fencing token from
    Run.fencing_seq, the lease's expiry in database time, the tokenizer fingerprint stored (or
    matched). A pool learner attaches only to a run it holds (`pool_learner_id`); a run's own
    learner only while no pool learner's take holds it, and then the run is no pool learner's.
    None when refused; nothing changed then. (The status moves in server/runs/lifecycle.py.)"""
    pool: list[ColumnElement[bool]]
    if pool_learner_id is None:
        pool = [pool_hold_free()]
        cleared: dict[str, Any] = {"pool_learner_id": None, "pool_held_until": None}
    else:
        pool, cleared = [Run.pool_learner_id == pool_learner_id], {}
    row = session.execute(
        update(Run)
        .where(
            Run.id == run_id,
            Run.status.in_(ATTACHABLE_STATUSES),
            lease_free(),
            fingerprint_fits(fingerprint),
            *pool,
        )
        .values(
            fencing_seq=NEXT_FENCING,
            learner_fencing=NEXT_FENCING,
            learner_expires_at=db_now_plus(ttl_s),
            learner_attached_at=db_now(),
            tokenizer_fingerprint=fingerprint,
            updated_at=db_now(),
            **cleared,
        )
        .returning(*_FENCED_COLUMNS)
        .execution_options(**_NO_SYNC)
    ).first()
    return _fenced(row)


def fence(
    session: Session, run_id: uuid.UUID, fencing: int, ttl_s: float, *, live_run: bool = True
) -> FencedRun | None:
    """The learner's compare-and-set: holds only for the current token of an unexpired
    learner lease (and, with live_run, a run not completed/failed/cancelled); extends the
    lease and locks the run row for the rest of the transaction. None when lost."""
    conditions = [
        Run.id == run_id,
        Run.learner_fencing == fencing,
        Run.learner_expires_at > db_now(),
    ]
    if live_run:
        conditions.append(Run.status.not_in(TERMINAL_RUN_STATUSES))
    row = session.execute(
        update(Run)
        .where(*conditions)
        .values(learner_expires_at=db_now_plus(ttl_s))
        .returning(*_FENCED_COLUMNS)
        .execution_options(**_NO_SYNC)
    ).first()
    return _fenced(row)


def release_claims(session: Session, run_id: uuid.UUID) -> int:
    """Claimed-but-unpublished batches (and their rows) go back to `accepted`."""
    ids = list(
        session.execute(
            update(RolloutBatch)
            .where(RolloutBatch.run_id == run_id, RolloutBatch.state == "claimed")
            .values(state="accepted", claimed_fencing=None, staleness=None, target_version=None)
            .returning(RolloutBatch.id)
            .execution_options(**_NO_SYNC)
        ).scalars()
    )
    if ids:
        session.execute(
            update(PromptRow)
            .where(PromptRow.batch_id.in_(ids), PromptRow.state == "claimed")
            .values(state="accepted")
            .execution_options(**_NO_SYNC)
        )
    return len(ids)


def adapter_version(session: Session, run_id: uuid.UUID, version: int) -> AdapterVersion | None:
    return session.execute(
        select(AdapterVersion).where(
            AdapterVersion.run_id == run_id, AdapterVersion.version == version
        )
    ).scalar_one_or_none()


def latest_checkpoint(session: Session, run_id: uuid.UUID, at_most: int) -> AdapterVersion | None:
    """The latest live version ≤ at_most that carries checkpoint files (a version may carry
    none). Retention keeps it (invariant 13) and deletes all but a few older versions, so the
    scan is short."""
    versions = session.execute(
        select(AdapterVersion)
        .where(
            AdapterVersion.run_id == run_id,
            AdapterVersion.version <= at_most,
            AdapterVersion.deleted.is_(False),
        )
        .order_by(AdapterVersion.version.desc())
    ).scalars()
    return next((v for v in versions if v.checkpoint_files), None)


def reject_batch(
    session: Session,
    batch_id: uuid.UUID,
    reason: str,
    detail: str | None,
    *,
    from_state: str,
    staleness: int | None = None,
    target_version: int | None = None,
) -> bool:
    values: dict[str, Any] = {"state": "rejected", "reject_reason": reason, "reject_detail": detail}
    if staleness is not None:
        values["staleness"] = staleness
    if target_version is not None:
        values["target_version"] = target_version
    row = session.execute(
        update(RolloutBatch)
        .where(RolloutBatch.id == batch_id, RolloutBatch.state == from_state)
        .values(**values)
        .returning(RolloutBatch.id)
        .execution_options(**_NO_SYNC)
    ).first()
    return row is not None


def claim_batch(
    session: Session,
    batch_id: uuid.UUID,
    fencing: int,
    staleness: int | None,
    target_version: int | None,
) -> None:
    """Every kind's claim of one accepted batch: claimed under the learner's token with the
    staleness and target version its kind records (eval's: none), its prompt rows (a training
    batch's; an eval batch has none) claimed with it."""
    session.execute(
        update(RolloutBatch)
        .where(RolloutBatch.id == batch_id, RolloutBatch.state == "accepted")
        .values(
            state="claimed",
            claimed_fencing=fencing,
            staleness=staleness,
            target_version=target_version,
        )
        .execution_options(**_NO_SYNC)
    )
    session.execute(
        update(PromptRow)
        .where(PromptRow.batch_id == batch_id, PromptRow.state == "accepted")
        .values(state="claimed")
        .execution_options(**_NO_SYNC)
    )


def prompts_of_batches(
    session: Session, batch_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, list[dict[str, Any]]]:
    """Each batch's prompt rows with the dataset row's prompt and reference columns."""
    out: dict[uuid.UUID, list[dict[str, Any]]] = {b: [] for b in batch_ids}
    if not batch_ids:
        return out
    rows = session.execute(
        select(
            PromptRow.batch_id,
            PromptRow.id,
            PromptRow.epoch,
            DatasetRow.id,
            DatasetRow.prompt,
            DatasetRow.reference,
        )
        .join(DatasetRow, DatasetRow.id == PromptRow.dataset_row_id)
        .where(PromptRow.batch_id.in_(list(batch_ids)))
        .order_by(PromptRow.queue_pos, PromptRow.id)
    ).all()
    for batch_id, row_id, epoch, ds_id, prompt, reference in rows:
        out[batch_id].append(
            {
                "prompt_row_id": row_id,
                "dataset_row_id": ds_id,
                "prompt": prompt,
                "reference": reference or {},
                "epoch": epoch,
            }
        )
    return out


def open_rows(session: Session, run_id: uuid.UUID) -> int:
    """Rows still to lease or in flight outside the learner: queued, leased or accepted."""
    return int(
        session.execute(
            select(func.count())
            .select_from(PromptRow)
            .where(PromptRow.run_id == run_id, PromptRow.state.in_(OPEN_ROW_STATES))
        ).scalar_one()
    )


def get_batch(session: Session, run_id: uuid.UUID, batch_id: uuid.UUID) -> RolloutBatch | None:
    return session.execute(
        select(RolloutBatch)
        .where(RolloutBatch.id == batch_id, RolloutBatch.run_id == run_id)
        .execution_options(populate_existing=True)
    ).scalar_one_or_none()


def claimed_targets(
    session: Session, run_id: uuid.UUID, batch_ids: Sequence[uuid.UUID], fencing: int
) -> dict[uuid.UUID, int | None]:
    """{batch id: the target version it was claimed for} of those batches claimed under this
    token (None only for a claim made before targets were stored)."""
    if not batch_ids:
        return {}
    return dict(
        session.execute(
            select(RolloutBatch.id, RolloutBatch.target_version).where(
                RolloutBatch.run_id == run_id,
                RolloutBatch.id.in_(list(batch_ids)),
                RolloutBatch.state == "claimed",
                RolloutBatch.claimed_fencing == fencing,
            )
        ).all()
    )


def advance_version(session: Session, run_id: uuid.UUID, fencing: int, version: int) -> bool:
    """Compare-and-set: current_version goes to `version` only from `version - 1`, under the
    current learner token."""
    row = session.execute(
        update(Run)
        .where(
            Run.id == run_id,
            Run.current_version == version - 1,
            Run.learner_fencing == fencing,
            Run.learner_expires_at > db_now(),
        )
        .values(current_version=version, last_version_at=db_now(), updated_at=db_now())
        .returning(Run.id)
        .execution_options(**_NO_SYNC)
    ).first()
    return row is not None


def insert_adapter_version(session: Session, **fields: Any) -> AdapterVersion:
    version = AdapterVersion(**fields)
    session.add(version)
    session.flush()
    return version


def mark_consumed(session: Session, batch_ids: Sequence[uuid.UUID], version: int) -> int:
    if not batch_ids:
        return 0
    return len(
        session.execute(
            update(RolloutBatch)
            .where(RolloutBatch.id.in_(list(batch_ids)), RolloutBatch.state == "claimed")
            .values(state="consumed", consumed_version=version)
            .returning(RolloutBatch.id)
            .execution_options(**_NO_SYNC)
        ).all()
    )


def reject_unconsumed(
    session: Session, run_id: uuid.UUID, reason: str, *, kind: str | None = None
) -> None:
    """Every accepted or claimed batch of the run (of this kind, when given) is rejected with
    this reason (the run, or its training, ended)."""
    kinds = [ledger.of_kind(RolloutBatch.kind, kind)] if kind is not None else []
    session.execute(
        update(RolloutBatch)
        .where(
            RolloutBatch.run_id == run_id,
            RolloutBatch.state.in_(("accepted", "claimed")),
            *kinds,
        )
        .values(state="rejected", reject_reason=reason)
        .execution_options(**_NO_SYNC)
    )


def insert_metric_points(
    session: Session, run_id: uuid.UUID, source: str, points: list[dict[str, Any]]
) -> int:
    session.add_all(MetricPoint(run_id=run_id, source=source, **p) for p in points)
    session.flush()
    return len(points)


def metric_points(
    session: Session, run_id: uuid.UUID, source: str, since_step: int | None
) -> list[MetricPoint]:
    query = select(MetricPoint).where(MetricPoint.run_id == run_id, MetricPoint.source == source)
    if since_step is not None:
        query = query.where(MetricPoint.step >= since_step)
    return list(session.execute(query.order_by(MetricPoint.step, MetricPoint.id)).scalars())


def batch_stats(session: Session, run_id: uuid.UUID) -> list[Any]:
    """(adapter_version, state, reject_reason, staleness, batches, samples) groups."""
    return list(
        session.execute(
            select(
                RolloutBatch.adapter_version,
                RolloutBatch.state,
                RolloutBatch.reject_reason,
                RolloutBatch.staleness,
                func.count(),
                func.coalesce(func.sum(RolloutBatch.n_samples), 0),
            )
            .where(RolloutBatch.run_id == run_id)
            .group_by(
                RolloutBatch.adapter_version,
                RolloutBatch.state,
                RolloutBatch.reject_reason,
                RolloutBatch.staleness,
            )
        ).all()
    )


def versions_in_use(session: Session, run_id: uuid.UUID) -> set[int]:
    """Adapter versions named by an active lease, an unconsumed (accepted/claimed) batch, or
    kept by a work kind (an eval still pending: server/leases/kinds.py retained_versions)."""
    leased = select(Lease.adapter_version).where(Lease.run_id == run_id, Lease.state == "active")
    batched = select(RolloutBatch.adapter_version).where(
        RolloutBatch.run_id == run_id, RolloutBatch.state.in_(("accepted", "claimed"))
    )
    kept = [k.retained_versions(run_id) for k in KINDS.values()]
    union = leased.union(batched, *(s for s in kept if s is not None))
    return set(session.execute(union).scalars())


def live_versions(session: Session, run_id: uuid.UUID) -> list[AdapterVersion]:
    return list(
        session.execute(
            select(AdapterVersion)
            .where(AdapterVersion.run_id == run_id, AdapterVersion.deleted.is_(False))
            .order_by(AdapterVersion.version)
        ).scalars()
    )


def mark_deleted(session: Session, version_ids: Sequence[uuid.UUID]) -> None:
    if version_ids:
        session.execute(
            update(AdapterVersion)
            .where(AdapterVersion.id.in_(list(version_ids)))
            .values(deleted=True)
            .execution_options(**_NO_SYNC)
        )


def row_counts(session: Session, run_id: uuid.UUID) -> list[Any]:
    """(epoch, state, drop_reason, count) groups of the run's prompt rows."""
    return list(
        session.execute(
            select(PromptRow.epoch, PromptRow.state, PromptRow.drop_reason, func.count())
            .where(PromptRow.run_id == run_id)
            .group_by(PromptRow.epoch, PromptRow.state, PromptRow.drop_reason)
        ).all()
    )


def consumed_without_version(session: Session, run_id: uuid.UUID) -> int:
    """Consumed rows that do not name the version they went into (must be none)."""
    return int(
        session.execute(
            select(func.count())
            .select_from(PromptRow)
            .where(
                and_(
                    PromptRow.run_id == run_id,
                    PromptRow.state == "consumed",
                    PromptRow.consumed_version.is_(None),
                )
            )
        ).scalar_one()
    )
