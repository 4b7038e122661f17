"""All SQL of the worker side of the rollout proxy."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Row,
    bindparam,
    insert,
    select,
    update,
)
from sqlalchemy.orm import Session

from server.db_types import db_now, db_now_plus
from server.models import (
    AdapterVersion,
    DatasetRow,
    Lease,
    PromptRow,
    RolloutBatch,
    Run,
    Token,
    Worker,
)
from server.workers.repository import authenticated


def lock_queued_rows(session: Session, run_id: uuid.UUID, n: int) -> list[Row[Any]]:
    """The first n queued rows of the run with their prompts: the grant's SQLite form
    (server/leases/statements.py), whose single writer already excludes everyone else; on
    Postgres the one-statement grant locks them with SKIP LOCKED."""
    stmt = (
        select(PromptRow.id, PromptRow.dataset_row_id, PromptRow.epoch, DatasetRow.prompt)
        .join(DatasetRow, DatasetRow.id == PromptRow.dataset_row_id)
        .where(PromptRow.run_id == run_id, PromptRow.state == "queued")
        .order_by(PromptRow.queue_pos)
        .limit(n)
    )
    return list(session.execute(stmt).all())


def insert_lease(session: Session, **values: Any) -> None:
    session.execute(insert(Lease).values(**values))


def mark_rows_leased(session: Session, row_ids: list[int], lease_id: uuid.UUID) -> None:
    session.execute(
        update(PromptRow)
        .where(PromptRow.id.in_(row_ids), PromptRow.state == "queued")
        .values(state="leased", lease_id=lease_id)
        .execution_options(synchronize_session=False)
    )


def adapter_version(session: Session, run_id: uuid.UUID, version: int) -> AdapterVersion | None:
    return session.execute(
        select(AdapterVersion).where(
            AdapterVersion.run_id == run_id, AdapterVersion.version == version
        )
    ).scalar_one_or_none()


def lease_of_worker(session: Session, lease_id: uuid.UUID, worker_id: uuid.UUID) -> Any:
    """The lease with its run's fields, only if this worker holds it (else None: a 404)."""
    return session.execute(
        select(
            Lease.id,
            Lease.run_id,
            Lease.fencing,
            Lease.adapter_version,
            Lease.group_size,
            Lease.kind,
            Run.status,
            Run.current_version,
            Run.tokenizer_fingerprint,
        )
        .join(Run, Run.id == Lease.run_id)
        .where(Lease.id == lease_id, Lease.worker_id == worker_id)
    ).first()


def lease_of_caller() -> Any:
    """The lease (any state) with its run's fingerprint, only if the worker authenticated by
    the token digest (parameters `digest`, `lease_id`) holds it; else no row."""
    return (
        select(
            Lease.id,
            Lease.run_id,
            Lease.worker_id,
            Lease.fencing,
            Lease.adapter_version,
            Lease.n_prompts,
            Lease.group_size,
            Lease.kind,
            Run.tokenizer_fingerprint,
        )
        .join(Worker, Worker.id == Lease.worker_id)
        .join(Token, Token.scope_id == Worker.id)
        .join(Run, Run.id == Lease.run_id)
        .where(Lease.id == bindparam("lease_id"), authenticated(bindparam("digest")))
    )


def fence(
    session: Session, lease_id: uuid.UUID, worker_id: uuid.UUID, fencing: int, **values: Any
) -> bool:
    """The fenced compare-and-set: `UPDATE leases SET … WHERE id AND worker AND fencing AND
    state='active' AND expires_at > db_now() RETURNING id`. False: nothing changed."""
    return (
        session.execute(
            update(Lease)
            .where(
                Lease.id == lease_id,
                Lease.worker_id == worker_id,
                Lease.fencing == fencing,
                Lease.state == "active",
                Lease.expires_at > db_now(),
            )
            .values(**values)
            .returning(Lease.id)
            .execution_options(synchronize_session=False)
        ).first()
        is not None
    )


def extend_values(ttl_s: float) -> dict[str, Any]:
    return {"expires_at": db_now_plus(ttl_s), "last_heartbeat_at": db_now()}


def end_values(state: str, reason: str) -> dict[str, Any]:
    return {"state": state, "ended_at": db_now(), "end_reason": reason}


def leased_rows_of(session: Session, lease_ids: Sequence[uuid.UUID]) -> list[int]:
    """The rows still leased under these leases, in queue order."""
    if not lease_ids:
        return []
    return list(
        session.execute(
            select(PromptRow.id)
            .where(PromptRow.lease_id.in_(list(lease_ids)), PromptRow.state == "leased")
            .order_by(PromptRow.queue_pos, PromptRow.id)
        ).scalars()
    )


def rows_of_batch(session: Session, batch_id: uuid.UUID) -> list[int]:
    """The prompt rows a batch holds, in queue order."""
    return list(
        session.execute(
            select(PromptRow.id).where(PromptRow.batch_id == batch_id).order_by(PromptRow.queue_pos)
        ).scalars()
    )


def insert_batch(session: Session, **values: Any) -> uuid.UUID:
    batch_id = uuid.uuid4()
    session.execute(insert(RolloutBatch).values(id=batch_id, **values))
    return batch_id


def accept_rows(session: Session, row_ids: list[int], batch_id: uuid.UUID) -> None:
    session.execute(
        update(PromptRow)
        .where(PromptRow.id.in_(row_ids), PromptRow.state == "leased")
        .values(state="accepted", batch_id=batch_id)
        .execution_options(synchronize_session=False)
    )


def abort_active(
    session: Session, run_id: uuid.UUID, reason: str, *, only: ColumnElement[bool] | None = None
) -> None:
    """Every active lease of the run (those `only` keeps, when given: a kind's, by the ledger's
    kind test) ends `aborted` with this reason (its rows are the queue's business:
    server/leases/queue.py)."""
    kept = [only] if only is not None else []
    session.execute(
        update(Lease)
        .where(Lease.run_id == run_id, Lease.state == "active", *kept)
        .values(**end_values("aborted", reason))
        .execution_options(synchronize_session=False)
    )
