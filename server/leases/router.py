"""Worker calls of the rollout proxy: acquire (long-poll), heartbeat, upload, complete, release.

Each call is answered by the one lease engine (service.py, fenced.py; its units: units.py),
and counted by name for /metrics; a long-poll holds no connection, thread or lock between its
tries."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request, Response, status

from protocol.schemas import (
    VERSIONS_HEADER,
    CompleteRequest,
    CompleteResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    HeartbeatsRequest,
    HeartbeatsResponse,
    Lease,
    LeaseAcquireRequest,
    ReleaseRequest,
    ReleaseResponse,
    UploadRequest,
    UploadResponse,
    format_versions_header,
)
from server import wakeups
from server.config import Settings
from server.leases import fenced, service
from server.leases.units import counted
from server.long_poll import long_poll
from server.request_deps import Credentials, WorkerCredentials
from server.routing import TransactionalRoute
from server.tokens.auth import bearer_token

router = APIRouter(prefix="/api/v1/leases", tags=["leases"], route_class=TransactionalRoute)


_VERSIONS_HEADER_DOC = {
    VERSIONS_HEADER: {
        "description": "The current version of every running run of the worker's base models: "
        "`<run_id>=<version>` pairs joined by commas (empty when none).",
        "schema": {"type": "string"},
    }
}


@router.post(
    "/acquire",
    response_model=Lease,
    responses={
        200: {"headers": _VERSIONS_HEADER_DOC},
        204: {
            "description": "No admissible work (after the long-poll, if any).",
            "headers": _VERSIONS_HEADER_DOC,
        },
    },
)
async def acquire(
    body: LeaseAcquireRequest, request: Request, response: Response, credentials: WorkerCredentials
) -> Lease | Response:
    """Long-poll: each try authenticates and grants on its own (service.acquire); the wait
    between tries is on the event loop, so idle workers hold no thread, no connection and no
    lock (nor SQLite's write lock). Both answers carry the versions the last try read."""
    settings: Settings = request.app.state.settings
    caller = _caller(request, credentials)
    acquired, _active = await long_poll(
        lambda _deadline: counted(
            request.app.state.worker_calls, "acquire", service.acquire(caller, body)
        ),
        lambda tried: tried[0].lease is not None or not tried[1],
        body.wait_s,
        settings,
        wakeups.LEASES,
    )
    versions = format_versions_header(acquired.versions)
    if acquired.lease is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT, headers={VERSIONS_HEADER: versions})
    response.headers[VERSIONS_HEADER] = versions
    return acquired.lease


@router.post("/heartbeat", response_model=HeartbeatsResponse)
async def heartbeats(
    body: HeartbeatsRequest, request: Request, credentials: WorkerCredentials
) -> HeartbeatsResponse:
    """Heartbeats of up to 512 held leases in one call, each answered on its own (200 with the
    heartbeat, or 404 / 409 as its single heartbeat would answer): a worker holding many
    leases makes one call per interval. Leases are processed in lease-id order."""
    caller = _caller(request, credentials)
    return await counted(
        request.app.state.worker_calls,
        "heartbeat",
        fenced.heartbeats(caller, body),
        count=len(body.leases),
    )


@router.post("/{lease_id}/heartbeat", response_model=HeartbeatResponse)
async def heartbeat(
    lease_id: uuid.UUID, body: HeartbeatRequest, request: Request, credentials: WorkerCredentials
) -> HeartbeatResponse:
    """Extend the lease by the run's lease_ttl_s, or abort it (stale, or the run no longer
    running) with its rows re-queued, answering `abort` with the reason."""
    caller = _caller(request, credentials)
    return await counted(
        request.app.state.worker_calls, "heartbeat", fenced.heartbeat(caller, lease_id, body)
    )


@router.post("/{lease_id}/upload", response_model=UploadResponse)
async def upload(
    lease_id: uuid.UUID, body: UploadRequest, request: Request, credentials: WorkerCredentials
) -> UploadResponse:
    """A presigned PUT for the lease's one batch key, bound to the given size and sha256 and
    to no overwrite."""
    caller = _caller(request, credentials)
    return await counted(
        request.app.state.worker_calls, "upload", fenced.upload(caller, lease_id, body)
    )


@router.post("/{lease_id}/complete", response_model=CompleteResponse)
async def complete(
    lease_id: uuid.UUID, body: CompleteRequest, request: Request, credentials: WorkerCredentials
) -> CompleteResponse:
    """End the lease `completed`: the uploaded batch is checked and stored `accepted`, or
    `rejected` with its rows re-queued."""
    caller = _caller(request, credentials)
    return await counted(
        request.app.state.worker_calls, "complete", fenced.complete(caller, lease_id, body)
    )


@router.post("/{lease_id}/release", response_model=ReleaseResponse)
async def release(
    lease_id: uuid.UUID, body: ReleaseRequest, request: Request, credentials: WorkerCredentials
) -> ReleaseResponse:
    """End the lease `released` with its reason; its rows go back to the front of the queue
    (engine_fault, environment_error and prompt_too_long count an attempt)."""
    caller = _caller(request, credentials)
    return await counted(
        request.app.state.worker_calls, "release", fenced.release(caller, lease_id, body)
    )


def _caller(request: Request, credentials: Credentials) -> service.Caller:
    """The call's context (401 for a missing bearer token)."""
    state = request.app.state
    return service.Caller(state.worker_db, state.store, state.settings, bearer_token(credentials))
