"""Worker calls of the rollout proxy: acquire (long-poll), heartbeat, upload, complete, release."""

from __future__ import annotations

import time
import uuid

from fastapi import APIRouter, Response, status

from protocol.schemas import (
    CompleteRequest,
    CompleteResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    Lease,
    LeaseAcquireRequest,
    ReleaseRequest,
    ReleaseResponse,
    UploadRequest,
    UploadResponse,
)
from server.deps import CurrentWorker, SessionDep, SettingsDep, StoreDep
from server.leases import service
from server.routing import TransactionalRoute
from server.workers.service import reload

router = APIRouter(prefix="/api/v1/leases", tags=["leases"], route_class=TransactionalRoute)

POLL_INTERVAL_S = 0.25


@router.post(
    "/acquire",
    response_model=Lease,
    responses={204: {"description": "No admissible work (after the long-poll, if any)."}},
)
def acquire(
    body: LeaseAcquireRequest,
    session: SessionDep,
    settings: SettingsDep,
    store: StoreDep,
    worker: CurrentWorker,
) -> Lease | Response:
    deadline = time.monotonic() + min(body.wait_s, settings.lease_long_poll_s)
    while True:
        lease = service.acquire(session, store, settings, worker, body)
        # Each try is its own transaction: never hold locks (or SQLite's write lock) while
        # sleeping. The route class commits the last one (server/routing.py).
        session.commit()
        if lease is not None or worker.status != "active" or time.monotonic() >= deadline:
            break
        time.sleep(min(POLL_INTERVAL_S, max(0.0, deadline - time.monotonic())))
        worker = reload(session, worker)  # revoked or quarantined while waiting
    if lease is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    return lease


@router.post("/{lease_id}/heartbeat", response_model=HeartbeatResponse)
def heartbeat(
    lease_id: uuid.UUID, body: HeartbeatRequest, session: SessionDep, worker: CurrentWorker
) -> HeartbeatResponse:
    return service.heartbeat(session, worker, lease_id, body)


@router.post("/{lease_id}/upload", response_model=UploadResponse)
def upload(
    lease_id: uuid.UUID,
    body: UploadRequest,
    session: SessionDep,
    settings: SettingsDep,
    store: StoreDep,
    worker: CurrentWorker,
) -> UploadResponse:
    return service.upload(session, store, settings, worker, lease_id, body)


@router.post("/{lease_id}/complete", response_model=CompleteResponse)
def complete(
    lease_id: uuid.UUID,
    body: CompleteRequest,
    session: SessionDep,
    store: StoreDep,
    worker: CurrentWorker,
) -> CompleteResponse:
    return service.complete(session, store, worker, lease_id, body)


@router.post("/{lease_id}/release", response_model=ReleaseResponse)
def release(
    lease_id: uuid.UUID, body: ReleaseRequest, session: SessionDep, worker: CurrentWorker
) -> ReleaseResponse:
    return service.release(session, worker, lease_id, body)
