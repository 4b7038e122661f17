from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime

from sqlalchemy.orm import Session

from protocol.capabilities import stored_capabilities
from protocol.error_codes import ErrorCode
from server.db import db_time
from server.errors import NotFound, Unauthorized
from server.models import Token, Worker
from server.tokens import service as tokens
from server.workers import repository
from server.workers.liveness import worker_state
from server.workers.schemas import WorkerOut, WorkerRegister


def register(session: Session, registration: Token, body: WorkerRegister) -> tuple[Worker, str]:
    """One use of the registration token counted; the worker, in the token's project (none:
    the shared fleet, server/projects/fleet.py), and its worker token."""
    tokens.consume_registration(session, registration)
    worker = repository.insert(
        session,
        name=body.name,
        gpu_type=body.gpu_type,
        gpu_count=body.gpu_count,
        price_per_hour=body.price_per_hour,
        models=body.models,
        environments=body.environments,
        capabilities=None if body.capabilities is None else body.capabilities.model_dump(),
        registration_token_id=registration.id,
        project_id=registration.project_id,
    )
    minted = tokens.mint(session, "worker", name=body.name, scope_id=worker.id)
    return worker, minted.plaintext


def effective_price(worker: Worker, table: dict[str, float]) -> float:
    """Admin override, then the admin price table per GPU type, then the self-report."""
    if worker.price_override is not None:
        return worker.price_override
    if worker.gpu_type in table:
        return table[worker.gpu_type] * max(worker.gpu_count, 1)
    return worker.price_per_hour


def to_out(worker: Worker, table: dict[str, float], now: datetime, silent_s: float) -> WorkerOut:
    return WorkerOut.model_validate(
        {
            **{c: getattr(worker, c) for c in WorkerOut.model_fields if hasattr(worker, c)},
            "effective_price_per_hour": effective_price(worker, table),
            "state": worker_state(worker.status, worker.last_seen_at, now, silent_s),
            "capabilities": stored_capabilities(worker.capabilities),
        }
    )


def list_workers(session: Session, silent_s: float) -> list[WorkerOut]:
    """Every worker with its derived state (server/workers/liveness.py) at database time."""
    table, now = repository.price_table(session), db_time(session)
    return [to_out(w, table, now, silent_s) for w in repository.list_all(session)]


# Ending a revoked worker's leases (and re-queueing their prompts) is the lease engine's rule
# (server/leases/expiry.py end_revoked_worker_leases), above workers in the feature order: the
# composition root hands it in (server/wiring.py).
LeaseEnder = Callable[[Session, uuid.UUID], object]
_lease_ender: list[LeaseEnder] = []


def end_leases_with(ender: LeaseEnder) -> None:
    _lease_ender[:] = [ender]


def revoke(session: Session, worker_id: uuid.UUID, silent_s: float) -> WorkerOut:
    """The worker `revoked`, its tokens revoked (its next call answers 401) and its active
    leases ended `revoked`, their prompts back in the queue at once (no attempt counted)."""
    if not _lease_ender:
        raise RuntimeError("no lease ender: call server.wiring.wire() at start")
    _lease_ender[0](session, worker_id)  # first: the grant's lock order
    if not repository.set_status(session, worker_id, "revoked", "revoked by an admin"):
        raise NotFound("worker not found", code=ErrorCode.worker_not_found)
    tokens.revoke_scope(session, "worker", worker_id)
    worker = repository.get(session, worker_id)
    assert worker is not None
    session.refresh(worker)
    return to_out(worker, repository.price_table(session), db_time(session), silent_s)


def set_trusted(
    session: Session, worker_id: uuid.UUID, trusted: bool, silent_s: float
) -> WorkerOut:
    """An admin marks a worker trusted (or not): leases of runs whose environment requires a
    trusted worker go only to trusted workers."""
    if not repository.set_trusted(session, worker_id, trusted):
        raise NotFound("worker not found", code=ErrorCode.worker_not_found)
    worker = repository.get(session, worker_id)
    assert worker is not None
    session.refresh(worker)
    return to_out(worker, repository.price_table(session), db_time(session), silent_s)


def worker_for_token(session: Session, plaintext: str) -> Worker:
    """The worker calling with this bearer token, by worker-token authentication's one rule
    (repository.authenticated), in one query for token and worker; when the rule refuses, why:
    401 for a bad, revoked or expired token or a revoked worker, 403 for another kind of
    token."""
    wanted = tokens.digest_of_bearer(plaintext)
    found = repository.caller(session, wanted)
    if found is not None and found[2] and found[1] is not None:
        return found[1]
    tokens.check(None if found is None else found[0], wanted, ("worker",))
    raise Unauthorized("worker revoked", code=ErrorCode.worker_revoked)
