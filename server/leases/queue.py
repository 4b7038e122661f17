"""The prompt-row queue and the admission counter (docs/architecture/lease-engine.md, "Units of
work" and invariants 6 and 15).

Prompt row states: queued -> leased -> accepted -> claimed -> consumed; leased, accepted and
claimed rows may go back to queued (re-queue, to the FRONT of the queue) or to dropped (after
max_attempts, or when the run completes). `Run.groups_in_flight` counts rows in
leased|accepted|claimed; only this module changes it, always in the same statement or
transaction as the row changes that move it.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Float,
    Integer,
    Row,
    String,
    Uuid,
    bindparam,
    exists,
    func,
    literal,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.orm import Session

from protocol.schemas import INT_MAX
from protocol.seeds import derived_seed, seed_prefix, seed_sql
from server.db_types import JSONType, db_now, postgres_text
from server.models import AdapterVersion, Lease, PromptRow, Run
from server.runs import service as runs
from server.runs.repository import NEXT_FENCING
from server.wakeups import LEARNER, LEASES, after_commit
from server.workers.repository import touch_sql

IN_FLIGHT = ("leased", "accepted", "claimed")
GRANTING = "running"  # the run status whose prompt rows a grant takes (server/leases/train.py)


@dataclass(frozen=True)
class RequeueResult:
    """Rows put back at the front of the queue, rows dropped, and the in-flight decrement."""

    requeued: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)


def requeue(
    session: Session,
    run_id: uuid.UUID,
    row_ids: Sequence[int],
    reason: str,
    *,
    count_attempt: bool,
) -> RequeueResult:
    """Put in-flight rows back at the front of the queue (their relative order kept).

    Clears lease_id/batch_id; increments attempts when `count_attempt`; drops rows whose
    attempts reached the run's max_attempts with drop_reason f"{reason}_exhausted"; decrements
    Run.groups_in_flight by the rows that left leased/accepted/claimed. Rows not in flight (or
    of another run) are ignored.
    """
    if not row_ids:
        return RequeueResult()
    rows = session.execute(
        select(PromptRow.id, PromptRow.attempts)
        .where(
            PromptRow.run_id == run_id,
            PromptRow.id.in_(list(row_ids)),
            PromptRow.state.in_(IN_FLIGHT),
        )
        .order_by(PromptRow.queue_pos, PromptRow.id)
        .with_for_update()
    ).all()
    if not rows:
        return RequeueResult()
    after_commit(session, LEASES, LEARNER)  # rows queued (or dropped), room under the bound
    limit = runs.config_of(session, run_id).max_attempts
    bump = 1 if count_attempt else 0
    back = [r for r in rows if not (count_attempt and r.attempts + bump >= limit)]
    gone = [r for r in rows if r not in back]
    head = session.execute(
        update(Run)
        .where(Run.id == run_id)
        .values(
            queue_head=Run.queue_head - len(back),
            groups_in_flight=Run.groups_in_flight - len(rows),
        )
        .returning(Run.queue_head)
    ).scalar_one()
    params = [
        {
            "id": r.id,
            "state": "queued",
            "queue_pos": head + i,
            "attempts": r.attempts + bump,
            "lease_id": None,
            "batch_id": None,
            "last_requeue_reason": reason,
        }
        for i, r in enumerate(back)
    ] + [
        {
            "id": r.id,
            "state": "dropped",
            "attempts": r.attempts + bump,
            "lease_id": None,
            "batch_id": None,
            "last_requeue_reason": reason,
            "drop_reason": f"{reason}_exhausted",
        }
        for r in gone
    ]
    _bulk_update(session, params)
    return RequeueResult(requeued=[r.id for r in back], dropped=[r.id for r in gone])


def _bulk_update(session: Session, params: list[dict[str, object]]) -> None:
    """Per-row updates by primary key, grouped by the set of columns they change."""
    groups: dict[tuple[str, ...], list[dict[str, object]]] = {}
    for p in params:
        groups.setdefault(tuple(sorted(p)), []).append(p)
    for rows in groups.values():
        session.execute(update(PromptRow).execution_options(synchronize_session=False), rows)


def consume(
    session: Session, run_id: uuid.UUID, batch_ids: Sequence[uuid.UUID], version: int
) -> int:
    """Mark the batches' accepted/claimed rows consumed in `version`; returns how many rows.

    Decrements Run.groups_in_flight by that number in the same transaction.
    """
    if not batch_ids:
        return 0
    consumed = session.execute(
        update(PromptRow)
        .where(
            PromptRow.run_id == run_id,
            PromptRow.batch_id.in_(list(batch_ids)),
            PromptRow.state.in_(("accepted", "claimed")),
        )
        .values(state="consumed", consumed_version=version)
        .returning(PromptRow.id)
        .execution_options(synchronize_session=False)
    ).all()
    if consumed:
        session.execute(
            update(Run)
            .where(Run.id == run_id)
            .values(groups_in_flight=Run.groups_in_flight - len(consumed))
        )
        after_commit(session, LEASES, LEARNER)  # room under the bound; a version published
    return len(consumed)


def admit(
    session: Session,
    run_id: uuid.UUID,
    n: int,
    bound: int,
    *,
    worker_id: uuid.UUID | None = None,
    worker_cap: int = INT_MAX,
) -> Row[int, int, str | None] | None:
    """The admission compare-and-set, taking the grant's fencing token in the same statement.

    `UPDATE runs SET groups_in_flight = groups_in_flight + n, fencing_seq = NEXT_FENCING,
    last_lease_at = now() WHERE id = :id AND status = 'running' AND groups_in_flight + n <=
    :bound AND <the run's rows in flight through the worker's leases are at most worker_cap - n> AND
    <the current version is 0 or has its adapter row> RETURNING fencing_seq, current_version,
    tokenizer_fingerprint`; None when the bound, the worker's fair share
    (server/leases/fair_share.py), the status or a version with nothing to hand out refuses (as
    the one-statement grant below) — never count-then-insert.
    """
    conditions = [
        Run.id == run_id,
        Run.status == GRANTING,
        Run.groups_in_flight + n <= bound,
        _published(),
    ]
    if worker_cap < INT_MAX:
        conditions.append(_worker_in_flight(run_id, worker_id) + n <= worker_cap)
    return session.execute(
        update(Run)
        .where(*conditions)
        .values(
            groups_in_flight=Run.groups_in_flight + n,
            fencing_seq=NEXT_FENCING,
            last_lease_at=db_now(),
        )
        .returning(Run.fencing_seq, Run.current_version, Run.tokenizer_fingerprint)
        .execution_options(synchronize_session=False)
    ).first()


def _published() -> ColumnElement[bool]:
    """The run's current version has something to hand out: the base model, or its adapter."""
    published = exists().where(
        AdapterVersion.run_id == Run.id, AdapterVersion.version == Run.current_version
    )
    return or_(Run.current_version == 0, published)


def _worker_in_flight(run_id: Any, worker_id: Any) -> Any:
    """The run's prompt rows in flight (leased, accepted or claimed) through this worker's
    leases: what the fair share counts, in the bound's own unit (an accepted row keeps its
    lease id until it is consumed or re-queued)."""
    return (
        select(func.count())
        .select_from(PromptRow)
        .join(Lease, Lease.id == PromptRow.lease_id)
        .where(
            PromptRow.run_id == run_id,
            PromptRow.state.in_([literal(state) for state in IN_FLIGHT]),  # compiled once
            Lease.worker_id == worker_id,
        )
        .scalar_subquery()
    )


def drop_unfinished(session: Session, run_id: uuid.UUID, reason: str) -> int:
    """Drop every row of the run that is neither consumed nor dropped (the run has ended), the
    in-flight ones leaving the admission counter; returns how many rows were dropped."""
    dropped = {"state": "dropped", "drop_reason": reason, "lease_id": None, "batch_id": None}
    in_flight = session.execute(
        update(PromptRow)
        .where(PromptRow.run_id == run_id, PromptRow.state.in_(IN_FLIGHT))
        .values(**dropped)
        .returning(PromptRow.id)
        .execution_options(synchronize_session=False)
    ).all()
    queued = session.execute(
        update(PromptRow)
        .where(PromptRow.run_id == run_id, PromptRow.state == "queued")
        .values(**dropped)
        .returning(PromptRow.id)
        .execution_options(synchronize_session=False)
    ).all()
    if in_flight:
        session.execute(
            update(Run)
            .where(Run.id == run_id)
            .values(groups_in_flight=Run.groups_in_flight - len(in_flight))
        )
    after_commit(session, LEARNER)  # the run's ledger closed: a claim answers exhausted
    return len(in_flight) + len(queued)


# -- the lease grant in one statement (Postgres; the hot path of `acquire`) --------------------
# Locking the first queued rows (SKIP LOCKED), the admission compare-and-set on the run row
# (which also takes the grant's fencing token and checks the worker's fair share), the lease
# insert and marking the rows leased are four statements (their SQLite form, from the same
# expressions — GRANTING, IN_FLIGHT, _published, _worker_in_flight: admit, run by
# server/leases/statements.py _grant_sqlite; docs/decisions/0020-hot-statements-once.md).
# Every acquire on a run serialises on its run row from the admission update until commit, so
# on Postgres they are one autocommitted statement: the run row is locked for that statement
# only; a grant also clears the worker's waiting_since (the worker row last). The lease seed is
# lease_seed computed in SQL (protocol/seeds.py seed_sql).


GRANT = (
    text(
        """
WITH picked AS (
    SELECT id, dataset_row_id, epoch, queue_pos FROM prompt_rows
    WHERE run_id = :run_id AND state = 'queued'
    ORDER BY queue_pos LIMIT :n
    FOR UPDATE SKIP LOCKED
), admitted AS (
    UPDATE runs SET groups_in_flight = groups_in_flight + (SELECT count(*) FROM picked),
                    fencing_seq = {next_fencing},
                    last_lease_at = clock_timestamp()
    WHERE id = :run_id AND status = '{granting}'
      AND (SELECT count(*) FROM picked) > 0
      AND groups_in_flight + (SELECT count(*) FROM picked) <= :bound
      AND CASE WHEN :worker_cap >= {no_cap} THEN true
               ELSE (SELECT count(*) FROM prompt_rows p JOIN leases l ON l.id = p.lease_id
                     WHERE p.run_id = :run_id AND l.worker_id = :worker_id
                       AND p.state IN ({in_flight}))
                    + (SELECT count(*) FROM picked) <= :worker_cap END
      AND (current_version = 0 OR EXISTS (SELECT 1 FROM adapter_versions
                                          WHERE run_id = :run_id AND version = current_version))
    RETURNING fencing_seq, current_version, tokenizer_fingerprint,
              (SELECT count(*) FROM picked) AS n_rows
), lease AS (
    INSERT INTO leases (id, run_id, worker_id, adapter_version, fencing, state, expires_at,
                        seed, n_prompts, group_size, created_at)
    SELECT :lease_id, :run_id, :worker_id, current_version, fencing_seq, 'active',
           clock_timestamp() + make_interval(secs => :ttl_s),
           {seed},
           n_rows, :group_size, clock_timestamp()
    FROM admitted
    RETURNING fencing, seed, adapter_version
), marked AS (
    UPDATE prompt_rows SET state = 'leased', lease_id = :lease_id
    WHERE id IN (SELECT id FROM picked) AND EXISTS (SELECT 1 FROM lease)
), granted AS (
    UPDATE workers SET {granted_worker}
    WHERE id = :worker_id AND EXISTS (SELECT 1 FROM lease)
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
        # no fair share: the count is never read
        .replace("{no_cap}", str(INT_MAX))
        .replace("{granting}", GRANTING)
        .replace("{in_flight}", ", ".join(f"'{state}'" for state in IN_FLIGHT))
        .replace("{next_fencing}", postgres_text(NEXT_FENCING))
        .replace("{seed}", seed_sql(":seed_prefix || fencing_seq::text"))
        .replace("{granted_worker}", touch_sql(seen=False, waiting=False))
    )
    .bindparams(
        bindparam("run_id", type_=Uuid),
        bindparam("worker_id", type_=Uuid),
        bindparam("lease_id", type_=Uuid),
        bindparam("n", type_=Integer),
        bindparam("bound", type_=BigInteger),
        bindparam("worker_cap", type_=BigInteger),
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
    worker_cap: int = INT_MAX,
) -> dict[str, Any]:
    """The grant statement's parameters (`worker_cap`: server/leases/fair_share.py)."""
    return {
        "worker_cap": worker_cap,
        "run_id": run_id,
        "worker_id": worker_id,
        "lease_id": lease_id,
        "n": n,
        "bound": bound,
        "ttl_s": ttl_s,
        "group_size": group_size,
        "seed_prefix": seed_prefix(run_seed, run_id),
    }


def lease_seed(run_seed: int, run_id: uuid.UUID, fencing: int) -> int:
    """Deterministic per grant: the run's seed and the grant's fencing token (protocol/seeds.py;
    the one-statement grant computes the same in SQL)."""
    return derived_seed(run_seed, run_id, fencing)


def seed_of(params: dict[str, Any], fencing: int) -> int:
    """The lease seed of a grant with these parameters and this fencing token: derived_seed of
    (run seed, run id, fencing), as the one-statement grant computes it in SQL."""
    return derived_seed(params["seed_prefix"] + str(fencing))
