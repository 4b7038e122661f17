from __future__ import annotations

import uuid

from fastapi import APIRouter, status

from server.audit.recorder import AuditDep
from server.request_deps import SessionDep, SettingsDep
from server.routing import TransactionalRoute
from server.tokens.auth import AdminDep, RegistrationDep
from server.workers import service
from server.workers.schemas import WorkerOut, WorkerRegister, WorkerRegistered

router = APIRouter(prefix="/api/v1/workers", tags=["workers"], route_class=TransactionalRoute)


@router.post("/register", status_code=status.HTTP_201_CREATED, response_model=WorkerRegistered)
def register(
    body: WorkerRegister, session: SessionDep, registration: RegistrationDep, audit: AuditDep
) -> WorkerRegistered:
    """Register a worker with a registration token (one use counted); answers the worker's
    id, its worker token (once) and its project, the token's (null: the shared fleet)."""
    worker, token = service.register(session, registration, body)
    audit.record(session, registration, "worker", worker.id, detail={"name": worker.name})
    return WorkerRegistered(id=worker.id, token=token, project_id=worker.project_id)


@router.get("", response_model=list[WorkerOut])
def list_workers(session: SessionDep, settings: SettingsDep, _admin: AdminDep) -> list[WorkerOut]:
    """Every worker; `state` says whether it is online (server/workers/liveness.py)."""
    return service.list_workers(session, settings.jobs.worker_silent_s)


@router.post("/{worker_id}/trust", response_model=WorkerOut)
def trust(
    worker_id: uuid.UUID,
    session: SessionDep,
    settings: SettingsDep,
    admin: AdminDep,
    audit: AuditDep,
) -> WorkerOut:
    """Mark the worker trusted: it may get leases of runs whose environment
    requires_trusted_worker (their rubric needs the answers on the worker)."""
    worker = service.set_trusted(session, worker_id, True, settings.jobs.worker_silent_s)
    audit.record(session, admin, "worker", worker_id)
    return worker


@router.post("/{worker_id}/untrust", response_model=WorkerOut)
def untrust(
    worker_id: uuid.UUID,
    session: SessionDep,
    settings: SettingsDep,
    admin: AdminDep,
    audit: AuditDep,
) -> WorkerOut:
    """Take the trusted mark away: no new leases of such runs (leases held run on)."""
    worker = service.set_trusted(session, worker_id, False, settings.jobs.worker_silent_s)
    audit.record(session, admin, "worker", worker_id)
    return worker


@router.post("/{worker_id}/revoke", response_model=WorkerOut)
def revoke(
    worker_id: uuid.UUID,
    session: SessionDep,
    settings: SettingsDep,
    admin: AdminDep,
    audit: AuditDep,
) -> WorkerOut:
    """Revoke the worker and its tokens: it gets no more leases and its calls are refused."""
    worker = service.revoke(session, worker_id, settings.jobs.worker_silent_s)
    audit.record(session, admin, "worker", worker_id)
    return worker
