"""All SQL of the eval ledger (docs/architecture/run-lifecycle.md, "Evaluation during training").
Nothing here commits; compare-and-set updates and database time only."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any, cast

from sqlalchemy import Table, delete, func, insert, literal, select, update
from sqlalchemy.orm import Session

from protocol.schemas import LEASING_RUN_STATUSES
from server.db import is_postgres
from server.db_types import db_now
from server.leases import ledger
from server.models import EvalItem, EvalResult, EvalRow, Lease, RolloutBatch, Run
from server.runs.repository import NEXT_FENCING, insert_row_pairs

_NO_SYNC = {"synchronize_session": False}
_ROW_INSERT = insert(cast(Table, EvalRow.__table__))
OPEN_ITEM_STATES = ("queued", "leased", "uploaded")


def insert_rows(
    session: Session, run_id: uuid.UUID, rows: Iterable[tuple[Any, dict[str, Any]]], start: int
) -> int:
    """Bulk-insert (prompt, reference) pairs as row_index start, start + 1, …"""
    return insert_row_pairs(session, _ROW_INSERT, run_id, rows, start)


def delete_rows(session: Session, run_id: uuid.UUID) -> None:
    """The run's eval rows (a preparation starting again; no eval item exists before attach)."""
    session.execute(delete(EvalRow).where(EvalRow.run_id == run_id))


def row_count(session: Session, run_id: uuid.UUID) -> int:
    return int(
        session.execute(
            select(func.count()).select_from(EvalRow).where(EvalRow.run_id == run_id)
        ).scalar_one()
    )


def result_of(session: Session, run_id: uuid.UUID, version: int) -> EvalResult | None:
    return session.execute(
        select(EvalResult)
        .where(EvalResult.run_id == run_id, EvalResult.version == version)
        .execution_options(populate_existing=True)
    ).scalar_one_or_none()


def insert_version(session: Session, run_id: uuid.UUID, version: int) -> int:
    """The version's result row (pending) and one queued item per eval row; returns the items."""
    n = row_count(session, run_id)
    session.execute(
        insert(EvalResult).values(
            run_id=run_id, version=version, state="pending", n_prompts=n, n_samples=0
        )
    )
    session.execute(
        insert(EvalItem).from_select(
            ["run_id", "version", "eval_row_id", "state", "attempts"],
            select(
                EvalRow.run_id,
                literal(version),
                EvalRow.id,
                literal("queued"),
                literal(0),
            )
            .where(EvalRow.run_id == run_id)
            .order_by(EvalRow.row_index),
        )
    )
    return n


def active_leases(session: Session, run_id: uuid.UUID, kind: str) -> int:
    """The run's active leases of this kind (the eval bound's count)."""
    return int(
        session.execute(
            select(func.count())
            .select_from(Lease)
            .where(
                Lease.run_id == run_id, ledger.of_kind(Lease.kind, kind), Lease.state == "active"
            )
        ).scalar_one()
    )


def lock_queued_items(session: Session, run_id: uuid.UUID, n: int) -> list[Any]:
    """Up to n queued items of the oldest version that has any, with their prompts, locked; in
    a lease's prompt shape (id, dataset_row_id: the eval row, prompt, epoch 0)."""
    oldest = (
        select(func.min(EvalItem.version))
        .where(EvalItem.run_id == run_id, EvalItem.state == "queued")
        .scalar_subquery()
    )
    stmt = (
        select(
            EvalItem.id,
            EvalItem.eval_row_id.label("dataset_row_id"),
            EvalItem.version,
            EvalRow.prompt,
            literal(0).label("epoch"),
        )
        .join(EvalRow, EvalRow.id == EvalItem.eval_row_id)
        .where(EvalItem.run_id == run_id, EvalItem.state == "queued", EvalItem.version == oldest)
        .order_by(EvalRow.row_index)
        .limit(n)
    )
    if is_postgres(session):
        stmt = stmt.with_for_update(of=EvalItem, skip_locked=True)
    return list(session.execute(stmt).all())


def lock_leasing_run(session: Session, run_id: uuid.UUID) -> bool:
    """Lock the run's row if it hands out leases (serialises the eval bound's count before
    anything is written). False when it does not."""
    stmt = select(Run.id).where(Run.id == run_id, Run.status.in_(LEASING_RUN_STATUSES))
    return session.execute(stmt.with_for_update()).first() is not None


def take_fencing(session: Session, run_id: uuid.UUID) -> Any:
    """The next fencing token of a run that runs or evaluates (never the admission counter)."""
    return session.execute(
        update(Run)
        .where(Run.id == run_id, Run.status.in_(LEASING_RUN_STATUSES))
        .values(fencing_seq=NEXT_FENCING, last_lease_at=db_now())
        .returning(Run.fencing_seq, Run.tokenizer_fingerprint)
        .execution_options(**_NO_SYNC)
    ).first()


def mark_items(session: Session, item_ids: Sequence[int], from_state: str, **values: Any) -> int:
    if not item_ids:
        return 0
    rows = session.execute(
        update(EvalItem)
        .where(EvalItem.id.in_(list(item_ids)), EvalItem.state == from_state)
        .values(**values)
        .returning(EvalItem.id)
        .execution_options(**_NO_SYNC)
    ).all()
    return len(rows)


def items_of_lease(session: Session, lease_id: uuid.UUID, state: str) -> list[int]:
    return list(
        session.execute(
            select(EvalItem.id)
            .where(EvalItem.lease_id == lease_id, EvalItem.state == state)
            .order_by(EvalItem.id)
        ).scalars()
    )


def _open_items(session: Session, *where: Any) -> list[Any]:
    return list(
        session.execute(
            select(EvalItem.id, EvalItem.run_id, EvalItem.version, EvalItem.attempts)
            .where(EvalItem.state.in_(("leased", "uploaded")), *where)
            .order_by(EvalItem.id)
            .with_for_update()
        ).all()
    )


def open_items_of_leases(session: Session, lease_ids: Sequence[uuid.UUID]) -> list[Any]:
    """Leased or uploaded items of these leases (id, run_id, version, attempts), locked."""
    return _open_items(session, EvalItem.lease_id.in_(list(lease_ids))) if lease_ids else []


def open_items_of_batch(session: Session, batch_id: uuid.UUID) -> list[Any]:
    return _open_items(session, EvalItem.batch_id == batch_id)


def requeue_items(session: Session, rows: Sequence[Any], bump: int, limit: int) -> list[int]:
    """Items back to queued (attempts + bump), or dropped once attempts reach limit; returns
    the versions touched."""
    back = [r.id for r in rows if r.attempts + bump < limit]
    gone = [r.id for r in rows if r.attempts + bump >= limit]
    cleared = {"lease_id": None, "batch_id": None, "attempts": EvalItem.attempts + bump}
    for ids, state in ((back, "queued"), (gone, "dropped")):
        if ids:
            session.execute(
                update(EvalItem)
                .where(EvalItem.id.in_(ids))
                .values(state=state, **cleared)
                .execution_options(**_NO_SYNC)
            )
    return sorted({r.version for r in rows})


def items_of_batch(session: Session, batch_id: uuid.UUID) -> list[Any]:
    return list(
        session.execute(
            select(EvalItem.id, EvalItem.eval_row_id, EvalItem.version, EvalRow.prompt)
            .add_columns(EvalRow.reference)
            .join(EvalRow, EvalRow.id == EvalItem.eval_row_id)
            .where(EvalItem.batch_id == batch_id)
            .order_by(EvalItem.id)
        ).all()
    )


def score_items(session: Session, scores: dict[int, tuple[float, int]], batch_id: uuid.UUID) -> int:
    """Each uploaded item of the batch scored (its reward sum and accurate samples)."""
    done = 0
    for item_id, (reward_sum, accurate) in scores.items():
        done += mark_items(
            session,
            [item_id],
            "uploaded",
            state="scored",
            reward_sum=reward_sum,
            accurate=accurate,
        )
    return done


def set_batch_state(session: Session, batch_id: uuid.UUID, from_state: str, **values: Any) -> bool:
    return (
        session.execute(
            update(RolloutBatch)
            .where(RolloutBatch.id == batch_id, RolloutBatch.state == from_state)
            .values(**values)
            .returning(RolloutBatch.id)
            .execution_options(**_NO_SYNC)
        ).first()
        is not None
    )


def version_tally(session: Session, run_id: uuid.UUID, version: int) -> Any:
    """(open items, scored items, reward sum, accurate samples, prompts with one accurate)."""
    scored = (EvalItem.state == "scored",)
    return session.execute(
        select(
            func.count().filter(EvalItem.state.in_(OPEN_ITEM_STATES)).label("open"),
            func.count().filter(*scored).label("scored"),
            func.coalesce(func.sum(EvalItem.reward_sum).filter(*scored), 0.0).label("reward"),
            func.coalesce(func.sum(EvalItem.accurate).filter(*scored), 0).label("accurate"),
            func.count().filter(*scored, EvalItem.accurate > 0).label("passed"),
        ).where(EvalItem.run_id == run_id, EvalItem.version == version)
    ).one()


def finish_result(session: Session, run_id: uuid.UUID, version: int, **values: Any) -> bool:
    return (
        session.execute(
            update(EvalResult)
            .where(
                EvalResult.run_id == run_id,
                EvalResult.version == version,
                EvalResult.state == "pending",
            )
            .values(state="done", scored_at=db_now(), **values)
            .returning(EvalResult.id)
            .execution_options(**_NO_SYNC)
        ).first()
        is not None
    )


def results(session: Session, run_id: uuid.UUID) -> list[EvalResult]:
    return list(
        session.execute(
            select(EvalResult).where(EvalResult.run_id == run_id).order_by(EvalResult.version)
        ).scalars()
    )


def pending_versions(session: Session, run_id: uuid.UUID) -> list[int]:
    return list(
        session.execute(
            select(EvalResult.version)
            .where(EvalResult.run_id == run_id, EvalResult.state == "pending")
            .order_by(EvalResult.version)
        ).scalars()
    )


def latest_done(session: Session) -> list[Any]:
    """Per run, the latest evaluated version's result (for /metrics)."""
    latest = (
        select(EvalResult.run_id, func.max(EvalResult.version).label("version"))
        .where(EvalResult.state == "done")
        .group_by(EvalResult.run_id)
        .subquery()
    )
    return list(
        session.execute(
            select(
                EvalResult.run_id,
                EvalResult.version,
                EvalResult.accuracy,
                EvalResult.mean_reward,
                EvalResult.pass_at_n,
            ).join(
                latest,
                (latest.c.run_id == EvalResult.run_id) & (latest.c.version == EvalResult.version),
            )
        ).all()
    )
