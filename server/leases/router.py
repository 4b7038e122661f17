"""Worker calls of the rollout proxy: acquire (long-poll), heartbeat, upload, complete, release."""

from __future__ import annotations

import asyncio
import time
import uuid

from fastapi import APIRouter, Request, Response, status
from fastapi.concurrency import run_in_threadpool

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
from server.config import Settings
from server.db import transaction
from server.deps import (
    Credentials,
    CurrentWorker,
    SessionDep,
    SettingsDep,
    StoreDep,
    current_worker,
)
from server.leases import service
from server.routing import TransactionalRoute

router = APIRouter(prefix="/api/v1/leases", tags=["leases"], route_class=TransactionalRoute)

POLL_INTERVAL_S = 0.25


@router.post(
    "/acquire",
    response_model=Lease,
    responses={204: {"description": "No admissible work (after the long-poll, if any)."}},
)
async def acquire(
    body: LeaseAcquireRequest, request: Request, credentials: Credentials
) -> Lease | Response:
    """Long-poll: each try authenticates and grants in its own short transaction in a worker
    thread; the wait between tries is on the event loop, so idle workers hold no thread, no
    connection and no lock (nor SQLite's write lock)."""
    state = request.app.state
    settings: Settings = state.settings
    deadline = time.monotonic() + min(body.wait_s, settings.lease_long_poll_s)

    def attempt() -> tuple[Lease | None, bool]:
        with transaction(state.sessionmaker) as session:
            worker = current_worker(session, credentials)
            lease = service.acquire(session, state.store, settings, worker, body)
            return lease, worker.status == "active"

    while True:
        lease, active = await run_in_threadpool(attempt)
        remaining = deadline - time.monotonic()
        if lease is not None or not active or remaining <= 0:
            break
        await asyncio.sleep(min(POLL_INTERVAL_S, remaining))
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
