"""All SQL of the worker side of the rollout proxy."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Float,
    Integer,
    Row,
    String,
    Uuid,
    bindparam,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql.psycopg import dialect as psycopg_dialect
from sqlalchemy.orm import Session, defer

from server.db import is_postgres
from server.db_types import JSONType, db_now, db_now_plus
from server.models import AdapterVersion, DatasetRow, Lease, PromptRow, RolloutBatch, Run, Worker


def candidate_runs(session: Session, models: list[str]) -> list[Run]:
    """Running runs of these base models, fairly: higher priority first, then the run leased
    least recently (never-leased first)."""
    if not models:
        return []
    return list(
        session.execute(
            select(Run)
            .options(defer(Run.config))
            .where(Run.status == "running", Run.base_model.in_(models))
            .order_by(Run.priority.desc(), Run.last_lease_at.asc().nulls_first(), Run.id)
        ).scalars()
    )


def lock_queued_rows(session: Session, run_id: uuid.UUID, n: int) -> list[Row[Any]]:
    """The first n queued rows of the run with their prompts, locked (SKIP LOCKED on Postgres;
    SQLite's single writer already excludes everyone else)."""
    stmt = (
        select(PromptRow.id, PromptRow.dataset_row_id, PromptRow.epoch, DatasetRow.prompt)
        .join(DatasetRow, DatasetRow.id == PromptRow.dataset_row_id)
        .where(PromptRow.run_id == run_id, PromptRow.state == "queued")
        .order_by(PromptRow.queue_pos)
        .limit(n)
    )
    if is_postgres(session):
        stmt = stmt.with_for_update(of=PromptRow, skip_locked=True)
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
            Run.status,
            Run.current_version,
            Run.tokenizer_fingerprint,
        )
        .join(Run, Run.id == Lease.run_id)
        .where(Lease.id == lease_id, Lease.worker_id == worker_id)
    ).first()


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


def leased_rows(session: Session, lease_id: uuid.UUID) -> list[int]:
    return list(
        session.execute(
            select(PromptRow.id)
            .where(PromptRow.lease_id == lease_id, PromptRow.state == "leased")
            .order_by(PromptRow.queue_pos)
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


def touch_worker(session: Session, worker_id: uuid.UUID, **counters: int) -> None:
    values: dict[str, Any] = {"last_seen_at": db_now()}
    for name, delta in counters.items():
        values[name] = getattr(Worker, name) + delta
    session.execute(
        update(Worker)
        .where(Worker.id == worker_id)
        .values(**values)
        .execution_options(synchronize_session=False)
    )


# -- the lease grant in one statement (Postgres; the hot path of `acquire`) --------------------
# Locking the first queued rows (SKIP LOCKED), the admission compare-and-set on the run row (which
# also takes the grant's fencing token), the lease insert and marking the rows leased are four
# round trips on the portable path (service._grant). Every acquire on a run serialises on its run
# row from the admission update until commit, so here they are one statement: the run row is
# locked for one round trip and the commit. The lease seed is service.lease_seed computed in SQL
# (the first 8 bytes of sha256("{run seed}:{run id}:{fencing}") as a non-negative bigint).

_GRANT = (
    text(
        """
WITH picked AS (
    SELECT id, dataset_row_id, epoch, queue_pos FROM prompt_rows
    WHERE run_id = :run_id AND state = 'queued'
    ORDER BY queue_pos LIMIT :n
    FOR UPDATE SKIP LOCKED
), admitted AS (
    UPDATE runs SET groups_in_flight = groups_in_flight + (SELECT count(*) FROM picked),
                    fencing_seq = fencing_seq + 1,
                    last_lease_at = clock_timestamp()
    WHERE id = :run_id AND status = 'running'
      AND (SELECT count(*) FROM picked) > 0
      AND groups_in_flight + (SELECT count(*) FROM picked) <= :bound
    RETURNING fencing_seq, current_version, tokenizer_fingerprint,
              (SELECT count(*) FROM picked) AS n_rows
), lease AS (
    INSERT INTO leases (id, run_id, worker_id, adapter_version, fencing, state, expires_at,
                        seed, n_prompts, group_size, created_at)
    SELECT :lease_id, :run_id, :worker_id, current_version, fencing_seq, 'active',
           clock_timestamp() + make_interval(secs => :ttl_s),
           ('x' || left(encode(sha256(convert_to(:seed_prefix || fencing_seq::text, 'UTF8')),
                               'hex'), 16))::bit(64)::bigint & 9223372036854775807,
           n_rows, :group_size, clock_timestamp()
    FROM admitted
    RETURNING fencing, seed, adapter_version
), marked AS (
    UPDATE prompt_rows SET state = 'leased', lease_id = :lease_id
    WHERE id IN (SELECT id FROM picked) AND EXISTS (SELECT 1 FROM lease)
)
SELECT picked.id, picked.dataset_row_id, picked.epoch, dataset_rows.prompt,
       lease.fencing, lease.seed, lease.adapter_version, admitted.tokenizer_fingerprint,
       adapter_versions.sha256 AS adapter_sha256, adapter_versions.files AS adapter_files
FROM picked
JOIN dataset_rows ON dataset_rows.id = picked.dataset_row_id
CROSS JOIN lease CROSS JOIN admitted
LEFT JOIN adapter_versions ON adapter_versions.run_id = :run_id
                          AND adapter_versions.version = lease.adapter_version
ORDER BY picked.queue_pos
"""
    )
    .bindparams(
        bindparam("run_id", type_=Uuid),
        bindparam("worker_id", type_=Uuid),
        bindparam("lease_id", type_=Uuid),
        bindparam("n", type_=Integer),
        bindparam("bound", type_=BigInteger),
        bindparam("ttl_s", type_=Float),
        bindparam("group_size", type_=Integer),
        bindparam("seed_prefix", type_=String),
    )
    .columns(
        id=BigInteger,
        dataset_row_id=BigInteger,
        epoch=Integer,
        prompt=JSONType,
        fencing=BigInteger,
        seed=BigInteger,
        adapter_version=Integer,
        tokenizer_fingerprint=String,
        adapter_sha256=String,
        adapter_files=JSONType,
    )
)
# The same statement for psycopg's own async connections (server/leases/fast_repository.py).
GRANT_SQL_PSYCOPG = str(_GRANT.compile(dialect=psycopg_dialect()))


@dataclass(frozen=True)
class Granted:
    """What one grant decided: its token, seed, version and rows (in queue order), and the
    version's adapter row (sha256, files) when the version is not the base model."""

    fencing: int
    seed: int
    version: int
    fingerprint: str | None
    rows: list[Any]
    adapter: tuple[str, dict[str, Any]] | None = None


def granted_from_rows(rows: list[Any]) -> Granted | None:
    """The grant statement's result (one row per leased prompt; none: nothing granted)."""
    if not rows:
        return None
    first = rows[0]
    adapter = None
    if first.adapter_sha256 is not None:
        adapter = (first.adapter_sha256, first.adapter_files)
    return Granted(
        fencing=first.fencing,
        seed=first.seed,
        version=first.adapter_version,
        fingerprint=first.tokenizer_fingerprint,
        rows=list(rows),
        adapter=adapter,
    )


def grant_params(
    *,
    run_id: uuid.UUID,
    worker_id: uuid.UUID,
    lease_id: uuid.UUID,
    n: int,
    bound: int,
    ttl_s: float,
    group_size: int,
    run_seed: int,
) -> dict[str, Any]:
    """The grant statement's parameters."""
    return {
        "run_id": run_id,
        "worker_id": worker_id,
        "lease_id": lease_id,
        "n": n,
        "bound": bound,
        "ttl_s": ttl_s,
        "group_size": group_size,
        "seed_prefix": f"{run_seed}:{run_id}:",
    }


def grant_in_one_statement(session: Session, params: dict[str, Any]) -> Granted | None:
    """Lease up to n queued rows of the run to the worker, or None (no queued row, the run is
    not running, or the admission bound refuses)."""
    return granted_from_rows(list(session.execute(_GRANT, params).all()))
