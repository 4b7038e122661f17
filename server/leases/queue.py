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
    and_,
    bindparam,
    case,
    exists,
    func,
    insert,
    literal,
    literal_column,
    or_,
    select,
    text,
    true,
    update,
)
from sqlalchemy.orm import Session

from protocol.schemas import INT_MAX
from protocol.seeds import derived_seed, seed_prefix, seed_sql
from server.db_types import db_now, db_now_plus
from server.models import AdapterVersion, DatasetRow, Lease, PromptRow, Run
from server.runs import service as runs
from server.runs.repository import NEXT_FENCING
from server.wakeups import LEARNER, LEASES, after_commit
from server.workers.repository import touch_update

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


def _grant_statement() -> Any:
    """The grant as one statement (writable CTEs), its parameters those of grant_params."""
    run_id = bindparam("run_id", type_=Uuid)
    worker_id = bindparam("worker_id", type_=Uuid)
    lease_id = bindparam("lease_id", type_=Uuid)
    worker_cap = bindparam("worker_cap", type_=BigInteger)
    picked = (
        select(PromptRow.id, PromptRow.dataset_row_id, PromptRow.epoch, PromptRow.queue_pos)
        .where(PromptRow.run_id == run_id, PromptRow.state == "queued")
        .order_by(PromptRow.queue_pos)
        .limit(bindparam("n", type_=Integer))
        .with_for_update(skip_locked=True)
        .cte("picked")
    )
    n_picked = select(func.count()).select_from(picked).scalar_subquery()
    capped = case(  # no fair share: the count is never read
        (worker_cap >= INT_MAX, true()),
        else_=_worker_in_flight(run_id, worker_id) + n_picked <= worker_cap,
    )
    admitted = (
        update(Run)
        .where(
            Run.id == run_id,
            Run.status == GRANTING,
            n_picked > 0,
            Run.groups_in_flight + n_picked <= bindparam("bound", type_=BigInteger),
            capped,
            _published(),
        )
        .values(
            groups_in_flight=Run.groups_in_flight + n_picked,
            fencing_seq=NEXT_FENCING,
            last_lease_at=db_now(),
        )
        .returning(
            Run.fencing_seq,
            Run.current_version,
            Run.tokenizer_fingerprint,
            n_picked.label("n_rows"),
        )
        .cte("admitted")
    )
    seed = text(seed_sql(":seed_prefix || fencing_seq::text")).bindparams(
        bindparam("seed_prefix", type_=String)
    )
    lease = (
        insert(Lease)
        .from_select(
            [
                "id",
                "run_id",
                "worker_id",
                "adapter_version",
                "fencing",
                "state",
                "expires_at",
                "seed",
                "n_prompts",
                "group_size",
                "created_at",
            ],
            select(
                lease_id,
                run_id,
                worker_id,
                admitted.c.current_version,
                admitted.c.fencing_seq,
                literal_column("'active'"),
                db_now_plus(bindparam("ttl_s", type_=Float)),
                seed,
                admitted.c.n_rows,
                bindparam("group_size", type_=Integer),
                db_now(),
            ).select_from(admitted),
            include_defaults=False,
        )
        .returning(Lease.fencing, Lease.seed, Lease.adapter_version)
        .cte("lease")
    )
    granted_lease = exists(select(lease.c.fencing))
    marked = (
        update(PromptRow)
        .where(PromptRow.id.in_(select(picked.c.id)), granted_lease)
        .values(state="leased", lease_id=lease_id)
        .cte("marked")
    )
    granted = touch_update(worker_id, seen=False, waiting=False).where(granted_lease).cte("granted")
    adapter = and_(
        AdapterVersion.run_id == run_id, AdapterVersion.version == lease.c.adapter_version
    )
    return (
        select(
            picked.c.id,
            picked.c.dataset_row_id,
            picked.c.epoch,
            DatasetRow.prompt,
            lease.c.fencing,
            lease.c.seed,
            lease.c.adapter_version,
            admitted.c.tokenizer_fingerprint,
            AdapterVersion.sha256.label("adapter_sha256"),
            AdapterVersion.files.label("adapter_files"),
        )
        .select_from(
            picked.join(DatasetRow, DatasetRow.id == picked.c.dataset_row_id)
            .join(lease, true())
            .join(admitted, true())
            .outerjoin(AdapterVersion, adapter)
        )
        .order_by(picked.c.queue_pos)
        .add_cte(marked, granted)
    )


GRANT = _grant_statement()


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
