"""The lease engine's one-statement units whose SQL differs between the databases, one small
named helper each with one result type (docs/architecture/lease-engine.md, "The lease engine"). On
Postgres each is one statement (writable CTEs: one round trip, the row locks taken in the engine's
order); SQLite has no writable CTEs, so there the same rule is a few statements in the unit's `BEGIN
IMMEDIATE` transaction, whose single writer already excludes everyone else. Both forms are built
from the same expressions (worker-token authentication, the held-lease rule, the abort reason), and
tests/server/leases run every call on both databases.

Everything else the engine runs is written once for both (repository.py, queue.py, and the
statements compiled for both by units.Statement.of)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, NamedTuple

from psycopg.types.json import Jsonb
from sqlalchemy import (
    ColumnElement,
    Select,
    Uuid,
    and_,
    bindparam,
    exists,
    func,
    insert,
    literal,
    literal_column,
    select,
    update,
)
from sqlalchemy.orm import Session, aliased

from protocol.capabilities import WorkerCapabilities, stored_capabilities
from protocol.schemas import LEASING_RUN_STATUSES
from server.db_types import db_now, db_now_plus, postgres_text, psycopg_param
from server.leases import queue
from server.leases import repository as repo
from server.leases.units import SqliteForm, Statement, WorkerDb
from server.models import Lease, PromptRow, RolloutBatch, Run, Token, Worker
from server.projects.fleet import serves
from server.wakeups import LEARNER, WAKEUPS, notify_from
from server.workers.repository import authenticated, touch, touch_sql, touch_update

# -- acquire: mark the worker seen and read what it may be granted -----------------------------


@dataclass(frozen=True)
class CandidateRun:
    """A run that hands out leases of one of the worker's models, fairest first."""

    id: uuid.UUID
    base_model: str
    status: str
    current_version: int
    groups_in_flight: int
    fencing_seq: int
    has_queued: bool  # any prompt row queued: without one the training grant is not tried


@dataclass(frozen=True)
class Seen:
    """An acquire try's first statement: the active worker, marked seen and waiting."""

    worker_id: uuid.UUID
    environments: list[str] | None
    capabilities: WorkerCapabilities | None
    trusted: bool
    any_expired: bool
    runs: list[CandidateRun]


# The candidate runs' rule, once: the runs that hand out leases, of a project the worker serves
# (server/projects/fleet.py, invariant 28), fairest first, each with whether any of its prompt
# rows is queued.
_LEASING_RUN = Run.status.in_([literal(status) for status in LEASING_RUN_STATUSES])
_FAIREST = (Run.priority.desc(), Run.last_lease_at.asc().nulls_first(), Run.id)
_CANDIDATE: dict[str, Any] = {
    "id": Run.id,
    "base_model": Run.base_model,
    "status": Run.status,
    "current_version": Run.current_version,
    "groups_in_flight": Run.groups_in_flight,
    "fencing_seq": Run.fencing_seq,
    "has_queued": exists().where(PromptRow.run_id == Run.id, PromptRow.state == "queued"),
}
_ANY_EXPIRED = exists().where(Lease.state == "active", Lease.expires_at <= db_now())


_LEASING = ", ".join(f"'{status}'" for status in LEASING_RUN_STATUSES)
# Worker-token authentication's one rule (server/workers/repository.py), over `t` and `w`.
_AUTHENTICATED_PG = postgres_text(
    authenticated(psycopg_param("digest"), aliased(Token, name="t"), aliased(Worker, name="w"))
)
# The project rule (server/projects/fleet.py), over `w` and `r`.
_SERVES_PG = postgres_text(
    serves(aliased(Worker, name="w").project_id, aliased(Run, name="r").project_id)
)

# Kept as text (docs/decisions/0020-hot-statements-once.md: its SQLAlchemy expression measured
# slower). Touching the worker first is safe here: the statement is its own transaction and
# locks nothing else. The worker is waiting from this try until a grant clears it.
_SEEN_PG = f"""
UPDATE workers w SET {
    touch_sql("w", waiting=True, environments="%(environments)s", capabilities="%(capabilities)s")
}
FROM tokens t
WHERE {_AUTHENTICATED_PG} AND w.status = 'active' AND w.models @> %(asked)s
RETURNING w.id AS worker_id, w.environments, w.capabilities, w.trusted,
    EXISTS (SELECT 1 FROM leases
            WHERE state = 'active' AND expires_at <= clock_timestamp()) AS any_expired,
    (SELECT coalesce(json_agg(json_build_object(
                'id', r.id, 'base_model', r.base_model, 'status', r.status,
                'current_version', r.current_version, 'groups_in_flight', r.groups_in_flight,
                'fencing_seq', r.fencing_seq,
                'has_queued', EXISTS (SELECT 1 FROM prompt_rows p
                                      WHERE p.run_id = r.id AND p.state = 'queued'))
            ORDER BY r.priority DESC, r.last_lease_at ASC NULLS FIRST, r.id), '[]')
     FROM runs r
     WHERE r.status IN ({_LEASING})
       AND r.base_model IN (SELECT jsonb_array_elements_text(w.models))
       AND ({_SERVES_PG})) AS runs
"""


_ACTIVE_WORKER = (
    select(
        Worker.id,
        Worker.models,
        Worker.environments,
        Worker.capabilities,
        Worker.trusted,
        Worker.project_id,
    )
    .join(Token, Token.scope_id == Worker.id)
    .where(authenticated(bindparam("digest")), Worker.status == "active")
)
_CANDIDATES = (
    select(*(column.label(name) for name, column in _CANDIDATE.items()))
    .where(
        _LEASING_RUN,
        Run.base_model.in_(bindparam("models", expanding=True)),
        serves(bindparam("worker_project", type_=Uuid), Run.project_id),
    )
    .order_by(*_FAIREST)
)


class _SeenRow(NamedTuple):
    worker_id: uuid.UUID
    environments: list[str] | None
    capabilities: dict[str, Any] | None
    trusted: bool
    any_expired: bool
    runs: list[dict[str, Any]]


def _seen_sqlite(session: Session, params: dict[str, Any]) -> list[_SeenRow]:
    found = session.execute(_ACTIVE_WORKER, {"digest": params["digest"]}).first()
    if found is None or not set(params["asked"]) <= set(found.models or ()):
        return []
    environments, capabilities = params["environments"], params["capabilities"]
    touch(session, found.id, waiting=True, environments=environments, capabilities=capabilities)
    models = list(found.models or ())
    candidates = {"models": models, "worker_project": found.project_id}
    runs = [r._asdict() for r in session.execute(_CANDIDATES, candidates)]
    declared = environments if environments is not None else found.environments
    can_load = capabilities if capabilities is not None else found.capabilities
    expired = bool(session.execute(select(_ANY_EXPIRED)).scalar())
    return [_SeenRow(found.id, declared, can_load, bool(found.trusted), expired, runs)]


_SEEN = Statement(_SEEN_PG, _seen_sqlite)


async def seen_for_acquire(
    db: WorkerDb,
    digest: str,
    asked: list[str] | None,
    environments: list[str] | None,
    capabilities: WorkerCapabilities | None = None,
) -> Seen | None:
    """Mark the authenticated active worker seen and waiting (storing the environments and
    capabilities it declares now; None keeps them): its id, environments, capabilities, trust,
    whether any lease has expired, and the leasing runs of its registered models and of the
    projects it serves (server/projects/fleet.py), fairest first. None, changing nothing: no
    live token of an active worker, or it asked for a model it did not register."""
    declared = None if capabilities is None else capabilities.model_dump()
    params: dict[str, Any] = {
        "digest": digest,
        "asked": asked or [],
        "environments": environments,
        "capabilities": declared,
    }
    if db.postgres:
        params["asked"] = Jsonb(params["asked"])
        params["environments"] = None if environments is None else Jsonb(environments)
        params["capabilities"] = None if declared is None else Jsonb(declared)
    row = await db.first(_SEEN, params)
    if row is None:
        return None
    runs = [
        CandidateRun(**{**r, "id": uuid.UUID(str(r["id"])), "has_queued": bool(r["has_queued"])})
        for r in row.runs
    ]
    can_load = stored_capabilities(row.capabilities)
    return Seen(
        row.worker_id, row.environments, can_load, bool(row.trusted), bool(row.any_expired), runs
    )


# -- a grant of training rows (the one-statement grant, or its steps) -------------------------


class _GrantedRow(NamedTuple):
    """One leased prompt of a grant, as the one-statement grant returns it."""

    id: int
    dataset_row_id: int
    epoch: int
    prompt: Any
    fencing: int
    seed: int
    adapter_version: int
    tokenizer_fingerprint: str | None
    adapter_sha256: str | None
    adapter_files: dict[str, Any] | None


def _grant_sqlite(session: Session, params: dict[str, Any]) -> list[_GrantedRow]:
    """The one-statement grant's steps: lock the first queued rows, the admission
    compare-and-set (taking the fencing token), insert the lease, mark the rows."""
    rows = repo.lock_queued_rows(session, params["run_id"], params["n"])
    if not rows:
        return []
    admitted = queue.admit(
        session,
        params["run_id"],
        len(rows),
        params["bound"],
        worker_id=params["worker_id"],
        worker_cap=params["worker_cap"],
    )
    if admitted is None:
        return []
    fencing, version, fingerprint = admitted
    seed = queue.seed_of(params, fencing)
    repo.insert_lease(
        session,
        id=params["lease_id"],
        run_id=params["run_id"],
        worker_id=params["worker_id"],
        adapter_version=version,
        fencing=fencing,
        state="active",
        expires_at=db_now_plus(params["ttl_s"]),
        seed=seed,
        n_prompts=len(rows),
        group_size=params["group_size"],
    )
    repo.mark_rows_leased(session, [r.id for r in rows], params["lease_id"])
    touch(session, params["worker_id"], waiting=False)
    adapter = repo.adapter_version(session, params["run_id"], version) if version > 0 else None
    sha256, files = (None, None) if adapter is None else (adapter.sha256, adapter.files)
    return [
        _GrantedRow(
            r.id,
            r.dataset_row_id,
            r.epoch,
            r.prompt,
            fencing,
            seed,
            version,
            fingerprint,
            sha256,
            files,
        )  # fmt: skip
        for r in rows
    ]


_GRANT = Statement.of(queue.GRANT, _grant_sqlite)


async def grant_rows(db: WorkerDb, params: dict[str, Any]) -> queue.Granted | None:
    """Lease up to n queued rows of the run to the worker within the admission bound and the
    worker's cap (queue.grant_params), clearing the worker's waiting; None changes nothing."""
    return queue.granted_from_rows(await db.one(_GRANT, params))


# -- heartbeat: extend a held lease, or say why not --------------------------------------------


@dataclass(frozen=True)
class Beat:
    """A heartbeat's statement: the lease as the worker holds it, and whether it was extended."""

    kind: str
    run_id: uuid.UUID
    worker_id: uuid.UUID
    current_version: int
    held: bool
    reason: str | None
    extended: bool


def held_now() -> ColumnElement[bool]:
    """The held-lease rule's columns (repository.fence's WHERE), for the token in `fencing`."""
    return and_(
        Lease.fencing == bindparam("held_fencing"),
        Lease.state == "active",
        Lease.expires_at > db_now(),
    )


def beat_statement(reason: ColumnElement[Any]) -> Statement:
    """The heartbeat's unit for one abort-reason expression (server/leases/ledger.py)."""
    seen = (
        select(
            Lease.id,
            Lease.kind,
            Lease.run_id,
            Lease.worker_id,
            Run.current_version,
            held_now().label("held"),
            reason.label("reason"),
        )
        .join(Worker, Worker.id == Lease.worker_id)
        .join(Token, Token.scope_id == Worker.id)
        .join(Run, Run.id == Lease.run_id)
        .where(Lease.id == bindparam("lease_id"), authenticated(bindparam("digest")))
    )
    found = seen.cte("seen")
    extended = (
        update(Lease)
        .where(
            Lease.id
            == select(found.c.id).where(found.c.held, found.c.reason.is_(None)).scalar_subquery(),
            held_now(),
        )
        .values(expires_at=db_now_plus(bindparam("ttl_s")), last_heartbeat_at=db_now())
        .returning(Lease.worker_id)
        .cte("extended")
    )
    touched = touch_update(select(extended.c.worker_id).scalar_subquery()).cte("touched")
    in_one = select(
        found.c.kind,
        found.c.run_id,
        found.c.worker_id,
        found.c.current_version,
        found.c.held,
        found.c.reason,
        exists(select(extended.c.worker_id)).label("extended"),
    ).add_cte(touched)
    return Statement.of(in_one, _beat_sqlite(seen))


def _beat_sqlite(seen: Select[Any]) -> SqliteForm:
    def steps(session: Session, params: dict[str, Any]) -> list[Beat]:
        row = session.execute(seen, params).first()
        if row is None:
            return []
        extended = False
        if row.held and row.reason is None:
            extend = repo.extend_values(params["ttl_s"])
            extended = repo.fence(session, row.id, row.worker_id, params["held_fencing"], **extend)
            touch(session, row.worker_id)
        return [
            Beat(
                row.kind,
                row.run_id,
                row.worker_id,
                row.current_version,
                row.held,
                row.reason,
                extended,
            )  # fmt: skip
        ]

    return steps


async def beat(db: WorkerDb, statement: Statement, params: dict[str, Any]) -> Beat | None:
    """Extend the worker's lease by ttl_s when it is held and its kind has no reason to abort it
    (the worker seen); else change nothing. None: no such lease of this authenticated worker.
    `params`: digest, lease_id, held_fencing, ttl_s, admission, max_staleness."""
    row = await db.first(statement, params)
    return row if row is None or isinstance(row, Beat) else Beat(*row)


# -- complete: accept a training batch in one statement ---------------------------------------

_BATCH_COLUMNS = (
    "id",
    "run_id",
    "lease_id",
    "worker_id",
    "adapter_version",
    "bucket_key",
    "sha256",
    "bytes",
    "n_samples",
    "n_tokens",
    "n_groups",
    "tokenizer_fingerprint",
    "state",
    "generation_seconds",
    "manifest",
)


def _accept_statement() -> Any:
    """The accept as one statement (writable CTEs: Postgres), from the engine's expressions:
    the held-lease rule, worker-token authentication, `touch`'s counter and the learner's
    wake-up."""
    leased = (
        select(func.count())
        .select_from(PromptRow)
        .where(PromptRow.lease_id == Lease.id, PromptRow.state == "leased")
        .scalar_subquery()
    )
    completed = (
        update(Lease)
        .where(
            Lease.id == bindparam("lease_id"),
            held_now(),
            Run.id == Lease.run_id,
            authenticated(bindparam("digest")),
            Lease.worker_id == Worker.id,
            Lease.n_prompts * Lease.group_size == bindparam("n_samples"),
            leased == Lease.n_prompts,
        )
        .values(**repo.end_values("completed", "completed"))
        .returning(
            Lease.id,
            Lease.run_id,
            Lease.worker_id,
            Lease.adapter_version,
            Lease.n_prompts,
            Run.tokenizer_fingerprint,
        )
        .cte("completed")
    )
    batch_values = select(
        bindparam("batch_id", type_=Uuid),
        completed.c.run_id,
        completed.c.id,
        completed.c.worker_id,
        completed.c.adapter_version,
        bindparam("bucket_key"),
        bindparam("sha256"),
        bindparam("bytes"),
        bindparam("n_samples"),
        bindparam("n_tokens"),
        completed.c.n_prompts,
        completed.c.tokenizer_fingerprint,
        literal_column("'accepted'"),
        bindparam("generation_seconds"),
        bindparam("manifest"),
    )
    batch = (
        insert(RolloutBatch)
        .from_select(_BATCH_COLUMNS, batch_values, include_defaults=False)
        .returning(RolloutBatch.id)
        .cte("batch")
    )
    accepted = (
        update(PromptRow)
        .where(
            PromptRow.lease_id == bindparam("lease_id"),
            PromptRow.state == "leased",
            exists(select(batch.c.id)),
        )
        .values(state="accepted", batch_id=bindparam("batch_id", type_=Uuid))
        .cte("accepted")
    )
    touched = touch_update(select(completed.c.worker_id).scalar_subquery(), accepted_batches=1).cte(
        "touched"
    )
    return select(batch.c.id).select_from(batch, notify_from(LEARNER)).add_cte(accepted, touched)


_ACCEPT = Statement.of(_accept_statement(), lambda _session, _params: [])


async def accept_in_one_statement(
    db: WorkerDb, digest: str, lease_id: uuid.UUID, fencing: int, values: dict[str, Any]
) -> uuid.UUID | None:
    """End the training lease `completed` — held by the worker this token digest authenticates
    (repository.authenticated's rule), its sample count that of its rows, every row still leased
    to it — insert its batch `accepted`, mark its rows accepted and count the worker's batch, in
    one statement (Postgres). None changed nothing: any of those does not hold, or the database
    is SQLite, which has no such statement: the caller takes the steps (server/leases/train.py)."""
    if not db.postgres:
        return None
    batch_id = uuid.uuid4()
    params = {
        **values,
        "manifest": Jsonb(values["manifest"]),
        "batch_id": batch_id,
        "lease_id": lease_id,
        "digest": digest,
        "held_fencing": fencing,
    }
    if await db.first(_ACCEPT, params) is None:
        return None
    WAKEUPS.notify(LEARNER)  # committed: the learner's claim (other processes: its pg_notify)
    return batch_id
