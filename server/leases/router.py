"""Worker calls of the rollout proxy: acquire (long-poll), heartbeat, upload, complete, release.

Each call is answered by the one lease engine (service.py, fenced.py; its units: units.py),
and counted by name for /metrics; a long-poll holds no connection, thread or lock between its
tries."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi import APIRouter, Request, Response, status
from pydantic import BaseModel

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
from server.idempotency.keys import KeyedCall, KeyHeader
from server.idempotency.store import Answer, sent
from server.leases import fenced, service
from server.leases.keyed import keyed, lease_key
from server.leases.units import counted
from server.long_poll import long_poll
from server.request_deps import Credentials, WorkerCredentials
from server.routing import TransactionalRoute
from server.tokens.auth import bearer_token

T = TypeVar("T", bound=BaseModel)

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
    body: LeaseAcquireRequest,
    request: Request,
    response: Response,
    credentials: WorkerCredentials,
    idempotency_key: KeyHeader = None,
) -> Lease | Response:
    """Long-poll: each try authenticates and grants on its own (service.acquire); the wait
    between tries is on the event loop, so idle workers hold no thread, no connection and no
    lock (nor SQLite's write lock). Both answers carry the versions the last try read. Under an
    Idempotency-Key, the try that grants stores its answer with the grant; a 204 is not kept."""
    settings: Settings = request.app.state.settings
    caller = _caller(request, credentials)
    call = await lease_key(idempotency_key, caller, request, body)

    async def attempt(_deadline: float) -> tuple[service.Acquired, bool] | Answer:
        one_try = counted(
            request.app.state.worker_calls, "acquire", _acquire_try(caller, call, body)
        )
        return await one_try

    acquired = await long_poll(
        attempt,
        lambda tried: isinstance(tried, Answer) or tried[0].lease is not None or not tried[1],
        body.wait_s,
        settings,
        wakeups.LEASES,
    )
    if isinstance(acquired, Answer):
        return acquired.response()
    versions = format_versions_header(acquired[0].versions)
    if acquired[0].lease is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT, headers={VERSIONS_HEADER: versions})
    response.headers[VERSIONS_HEADER] = versions
    return acquired[0].lease


async def _acquire_try(
    caller: service.Caller, call: KeyedCall | None, body: LeaseAcquireRequest
) -> tuple[service.Acquired, bool] | Answer:
    if call is None:
        return await service.acquire(caller, body)
    return await keyed(caller, call, lambda pinned: service.acquire(pinned, body), _granted)


def _granted(tried: tuple[service.Acquired, bool]) -> Answer | None:
    """A granting try's answer, kept with its grant; a try that granted nothing keeps none."""
    acquired = tried[0]
    if acquired.lease is None:
        return None
    return Answer.of(acquired.lease, {VERSIONS_HEADER: format_versions_header(acquired.versions)})


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
    lease_id: uuid.UUID,
    body: CompleteRequest,
    request: Request,
    credentials: WorkerCredentials,
    idempotency_key: KeyHeader = None,
) -> CompleteResponse | Response:
    """End the lease `completed`: the uploaded batch is checked and stored `accepted`, or
    `rejected` with its rows re-queued."""
    caller = _caller(request, credentials)
    call = await lease_key(idempotency_key, caller, request, body)
    answered = _fenced(caller, call, lambda pinned: fenced.complete(pinned, lease_id, body))
    return sent(await counted(request.app.state.worker_calls, "complete", answered))


@router.post("/{lease_id}/release", response_model=ReleaseResponse)
async def release(
    lease_id: uuid.UUID,
    body: ReleaseRequest,
    request: Request,
    credentials: WorkerCredentials,
    idempotency_key: KeyHeader = None,
) -> ReleaseResponse | Response:
    """End the lease `released` with its reason; its rows go back to the front of the queue
    (engine_fault, environment_error and prompt_too_long count an attempt)."""
    caller = _caller(request, credentials)
    call = await lease_key(idempotency_key, caller, request, body)
    answered = _fenced(caller, call, lambda pinned: fenced.release(pinned, lease_id, body))
    return sent(await counted(request.app.state.worker_calls, "release", answered))


async def _fenced(
    caller: service.Caller, call: KeyedCall | None, work: Callable[[service.Caller], Awaitable[T]]
) -> T | Answer:
    """A fenced call, under its Idempotency-Key when it has one (its answer kept with it)."""
    if call is None:
        return await work(caller)
    return await keyed(caller, call, work, Answer.of)


def _caller(request: Request, credentials: Credentials) -> service.Caller:
    """The call's context (401 for a missing bearer token)."""
    state = request.app.state
    return service.Caller(state.worker_db, state.store, state.settings, bearer_token(credentials))
