from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import ColumnElement, and_, func, null, select, update
from sqlalchemy.orm import Session

from server.db_types import db_now, json_has
from server.models import GpuPrice, Token, Worker
from server.projects.fleet import serves
from server.tokens.repository import Found, expired, revoked, usable


def authenticated(digest: Any, tokens: Any = Token, workers: Any = Worker) -> ColumnElement[bool]:
    """Worker-token authentication, its one definition (docs/architecture/security.md, "Tokens
    and security"): the token of this digest is a usable worker token (tokens.repository.usable)
    of a worker not revoked. A join condition over `tokens` and `workers` (the models or
    aliases of them): every worker call's statements (server/leases/) and the request-level
    check (server/workers/service.py worker_for_token, which says which part failed) use it."""
    return and_(
        tokens.digest == digest,
        tokens.kind == "worker",
        usable(tokens),
        workers.id == tokens.scope_id,
        workers.status != "revoked",
    )


def caller(session: Session, digest: str) -> tuple[Found, Worker | None, bool] | None:
    """The token of this digest, the worker it belongs to, and whether it authenticates that
    worker (`authenticated`), in one round trip; None: no such token."""
    row = session.execute(
        select(
            Token,
            revoked().label("revoked"),
            expired().label("expired"),
            Worker,
            authenticated(digest).label("authenticated"),
        )
        .outerjoin(Worker, Worker.id == Token.scope_id)
        .where(Token.digest == digest)
    ).first()
    if row is None:
        return None
    return Found(row[0], bool(row[1]), bool(row[2])), row[3], bool(row[4])


def insert(session: Session, **fields: Any) -> Worker:
    worker = Worker(**fields, last_seen_at=db_now())
    session.add(worker)
    session.flush()
    session.refresh(worker)
    return worker


def get(session: Session, worker_id: uuid.UUID) -> Worker | None:
    return session.get(Worker, worker_id)


def list_all(session: Session) -> list[Worker]:
    return list(session.execute(select(Worker).order_by(Worker.created_at)).scalars())


def active_of_model(session: Session, base_model: str, project_id: uuid.UUID) -> list[Worker]:
    """The active workers that registered `base_model` and serve runs of the project
    (server/projects/fleet.py; whether each is online is server/workers/liveness.py's to say)."""
    return list(
        session.execute(
            select(Worker)
            .where(
                Worker.status == "active",
                json_has(Worker.models, base_model),
                serves(Worker.project_id, project_id),
            )
            .order_by(Worker.created_at)
        ).scalars()
    )


def set_status(session: Session, worker_id: uuid.UUID, status: str, reason: str | None) -> bool:
    result = session.execute(
        update(Worker)
        .where(Worker.id == worker_id)
        .values(status=status, quarantine_reason=reason)
        .returning(Worker.id)
    )
    return result.first() is not None


def set_trusted(session: Session, worker_id: uuid.UUID, trusted: bool) -> bool:
    result = session.execute(
        update(Worker).where(Worker.id == worker_id).values(trusted=trusted).returning(Worker.id)
    )
    return result.first() is not None


def touch_values(
    *,
    seen: bool = True,
    waiting: bool | None = None,
    environments: Any = None,
    capabilities: Any = None,
    **counters: int,
) -> dict[str, Any]:
    """`touch`'s SET values: seen now, its counters raised; `waiting` (an acquire try): whether
    it was granted nothing, which starts (or keeps) its waiting_since, or a lease, which clears
    it; `environments` and `capabilities`: what it declares now (a value, or an expression
    whose NULL keeps them); `seen` False: not the sighting (a grant, whose acquire try already
    marked it)."""
    values: dict[str, Any] = {"last_seen_at": db_now()} if seen else {}
    if isinstance(environments, list):
        values["environments"] = environments
    elif environments is not None:
        values["environments"] = func.coalesce(environments, Worker.environments)
    if isinstance(capabilities, dict):
        values["capabilities"] = capabilities
    elif capabilities is not None:
        values["capabilities"] = func.coalesce(capabilities, Worker.capabilities)
    if waiting is not None:
        values["waiting_since"] = (
            func.coalesce(Worker.waiting_since, db_now()) if waiting else null()
        )
    for name, delta in counters.items():
        values[name] = getattr(Worker, name) + delta
    return values


def touch(
    session: Session,
    worker_id: uuid.UUID,
    *,
    waiting: bool | None = None,
    environments: list[str] | None = None,
    capabilities: dict[str, Any] | None = None,
    **counters: int,
) -> None:
    """Mark the worker seen (every authenticated worker call), add to its counters (see
    touch_values)."""
    session.execute(
        touch_update(
            worker_id,
            waiting=waiting,
            environments=environments,
            capabilities=capabilities,
            **counters,
        )
    )


def touch_update(worker_id: Any, **touch: Any) -> Any:
    """`touch` as an UPDATE statement for the worker `worker_id` names (a value or a SQL
    expression), to embed in a statement (server/leases/statements.py's heartbeat and accept,
    the one-statement grant); `touch`: touch_values's arguments."""
    return touch_where(Worker.id == worker_id, **touch)


def touch_where(*conditions: Any, **touch: Any) -> Any:
    """`touch` as an UPDATE of the workers these conditions keep (acquire's first statement:
    the worker its token authenticates)."""
    return (
        update(Worker)
        .where(*conditions)
        .values(**touch_values(**touch))
        .execution_options(synchronize_session=False)
    )


def touch_sql(
    target: str = "workers",
    *,
    seen: bool = True,
    waiting: bool | None = None,
    environments: str | None = None,
    capabilities: str | None = None,
    counters: tuple[str, ...] = (),
) -> str:
    """`touch`'s SET list in Postgres text, for the lease engine's one-statement units on
    Postgres (server/leases/statements.py) and the one-statement grant (server/leases/queue.py):
    `target` names the workers row, `environments` and `capabilities` are SQL expressions
    (NULL: keep them), each counter one more."""
    items = ["last_seen_at = clock_timestamp()"] if seen else []
    if environments is not None:
        items.append(f"environments = coalesce({environments}, {target}.environments)")
    if capabilities is not None:
        items.append(f"capabilities = coalesce({capabilities}, {target}.capabilities)")
    if waiting is not None:
        started = f"coalesce({target}.waiting_since, clock_timestamp())"
        items.append(f"waiting_since = {started if waiting else 'NULL'}")
    items += [f"{name} = {target}.{name} + 1" for name in counters]
    return ", ".join(items)


def price_table(session: Session) -> dict[str, float]:
    return {p.gpu_type: p.price_per_hour for p in session.execute(select(GpuPrice)).scalars()}


def count_rejection(session: Session, worker_id: uuid.UUID) -> None:
    """One more of the worker's batches rejected after acceptance (by the learner)."""
    session.execute(
        update(Worker)
        .where(Worker.id == worker_id)
        .values(rejected_batches=Worker.rejected_batches + 1)
        .execution_options(synchronize_session=False)
    )


def record_spot_check(session: Session, worker_id: uuid.UUID, value: float) -> Any:
    """Running mean of the worker's mismatch: m_n = m_{n-1} + (x - m_{n-1}) / n. Returns the
    worker's (status, spot_checks, spot_check_mismatch), or None for an unknown worker."""
    old = func.coalesce(Worker.spot_check_mismatch, 0.0)
    return session.execute(
        update(Worker)
        .where(Worker.id == worker_id)
        .values(
            spot_checks=Worker.spot_checks + 1,
            spot_check_mismatch=old + (value - old) / (Worker.spot_checks + 1),
        )
        .returning(Worker.status, Worker.spot_checks, Worker.spot_check_mismatch)
        .execution_options(synchronize_session=False)
    ).first()


def quarantine(session: Session, worker_id: uuid.UUID, reason: str) -> bool:
    """An active worker gets no more leases; False when it was not active."""
    row = session.execute(
        update(Worker)
        .where(Worker.id == worker_id, Worker.status == "active")
        .values(status="quarantined", quarantine_reason=reason)
        .returning(Worker.id)
        .execution_options(synchronize_session=False)
    ).first()
    return row is not None
