"""Worker calls of the rollout proxy: acquire (long-poll), heartbeat, upload, complete, release.

On Postgres the common case of acquire, heartbeat, upload and complete is answered on the event
loop (fast_service.py); everything else, and every call on SQLite, authenticates and does its
work in one transaction in one worker thread (deps.as_worker): no thread-pool hop or commit for
a separate auth dependency, and no connection held while a request waits for a thread."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

import psycopg
from fastapi import APIRouter, Request, Response, status
from psycopg_pool import AsyncConnectionPool
from sqlalchemy.orm import Session

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
from server.deps import Credentials, as_worker, bearer_digest
from server.leases import fast_service as fast
from server.leases import service
from server.models import Worker
from server.routing import TransactionalRoute

router = APIRouter(prefix="/api/v1/leases", tags=["leases"], route_class=TransactionalRoute)

POLL_INTERVAL_S = 0.25
T = TypeVar("T")


async def _answer(
    request: Request,
    credentials: Credentials,
    call: str,
    common_case: Callable[[AsyncConnectionPool, str], Awaitable[T]],
    portable: Callable[[Session, Worker], T],
) -> T:
    """The common case on the event loop where there is an async pool, else (or when it says
    Fallback) the portable path; each call, answered or refused, counted by path for /metrics."""
    state = request.app.state
    path = "event_loop" if state.pg_pool is not None else "portable"
    try:
        if path == "event_loop":
            try:
                return await common_case(state.pg_pool, bearer_digest(credentials))
            except fast.Fallback:
                path = "portable"
            except psycopg.OperationalError:
                # The database dropped its connections (a restart): test the idle ones now, so
                # that one request answers 503 rather than one per dead pooled connection.
                await state.pg_pool.check()
                raise
        return await as_worker(request, credentials, portable)
    finally:
        state.call_paths[(call, path)] += 1


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

    def attempt(session: Session, worker: Worker) -> tuple[Lease | None, bool]:
        lease = service.acquire(session, state.store, settings, worker, body)
        return lease, worker.status == "active"

    async def common_case(pool: AsyncConnectionPool, digest: str) -> tuple[Lease | None, bool]:
        return await fast.acquire(pool, state.store, settings, digest, body), True

    while True:
        lease, active = await _answer(request, credentials, "acquire", common_case, attempt)
        remaining = deadline - time.monotonic()
        if lease is not None or not active or remaining <= 0:
            break
        await asyncio.sleep(min(POLL_INTERVAL_S, remaining))
    if lease is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    return lease


@router.post("/{lease_id}/heartbeat", response_model=HeartbeatResponse)
async def heartbeat(
    lease_id: uuid.UUID, body: HeartbeatRequest, request: Request, credentials: Credentials
) -> HeartbeatResponse:
    return await _answer(
        request,
        credentials,
        "heartbeat",
        lambda pool, digest: fast.heartbeat(pool, digest, lease_id, body),
        lambda session, worker: service.heartbeat(session, worker, lease_id, body),
    )


@router.post("/{lease_id}/upload", response_model=UploadResponse)
async def upload(
    lease_id: uuid.UUID, body: UploadRequest, request: Request, credentials: Credentials
) -> UploadResponse:
    state = request.app.state
    return await _answer(
        request,
        credentials,
        "upload",
        lambda pool, digest: fast.upload(pool, state.store, state.settings, digest, lease_id, body),
        lambda session, worker: service.upload(
            session, state.store, state.settings, worker, lease_id, body
        ),
    )


@router.post("/{lease_id}/complete", response_model=CompleteResponse)
async def complete(
    lease_id: uuid.UUID, body: CompleteRequest, request: Request, credentials: Credentials
) -> CompleteResponse:
    store = request.app.state.store
    return await _answer(
        request,
        credentials,
        "complete",
        lambda pool, digest: fast.complete(pool, store, digest, lease_id, body),
        lambda session, worker: service.complete(session, store, worker, lease_id, body),
    )


@router.post("/{lease_id}/release", response_model=ReleaseResponse)
async def release(
    lease_id: uuid.UUID, body: ReleaseRequest, request: Request, credentials: Credentials
) -> ReleaseResponse:
    return await as_worker(
        request,
        credentials,
        lambda session, worker: service.release(session, worker, lease_id, body),
    )
