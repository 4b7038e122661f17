"""Which path answers a worker call. On Postgres (with `worker_calls_on_event_loop`) the common
case of acquire, heartbeat, upload and complete is answered on the event loop (fast_service.py);
when it raises `Fallback`, or there is no async pool (SQLite, or the setting off), the portable
path (service.py) answers in one transaction in one worker thread (deps.as_worker). Every
answer, refusals included, is counted by (call, path) for /metrics."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TypeVar

import psycopg
from fastapi import Request
from psycopg_pool import AsyncConnectionPool
from sqlalchemy.orm import Session

from protocol.schemas import (
    CompleteRequest,
    CompleteResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    HeartbeatsRequest,
    HeartbeatsResponse,
    LeaseAcquireRequest,
    LeaseBeat,
    LeaseBeatAnswer,
    UploadRequest,
    UploadResponse,
)
from server.deps import Credentials, as_worker, bearer_digest
from server.errors import FencingLost, NotFound
from server.leases import fast_service as fast
from server.leases import service
from server.models import Worker

T = TypeVar("T")
EVENT_LOOP = "event_loop"
PORTABLE = "portable"


class CallPaths(Counter[tuple[str, str]]):
    """How many worker calls each path answered, by (call, path): exported on /metrics."""


async def answer(
    request: Request,
    credentials: Credentials,
    call: str,
    common_case: Callable[[AsyncConnectionPool, str], Awaitable[T]],
    portable: Callable[[Session, Worker], T],
) -> T:
    """The common case on the event loop where there is an async pool, else (or when it says
    Fallback) the portable path; each call, answered or refused, counted by path."""
    state = request.app.state
    path = EVENT_LOOP if state.pg_pool is not None else PORTABLE
    try:
        if path == EVENT_LOOP:
            try:
                return await common_case(state.pg_pool, bearer_digest(credentials))
            except fast.Fallback:
                path = PORTABLE
            except psycopg.OperationalError:
                # The database dropped its connections (a restart): test the idle ones now, so
                # that one request answers 503 rather than one per dead pooled connection.
                await state.pg_pool.check()
                raise
        return await as_worker(request, credentials, portable)
    finally:
        state.call_paths[(call, path)] += 1


async def acquire_once(
    request: Request, credentials: Credentials, body: LeaseAcquireRequest
) -> tuple[service.Acquired, bool]:
    """One try of acquire: what it granted (a lease or None, and the versions of the worker's
    running runs) and whether the worker is active (an inactive one gets no lease however long
    it waits)."""
    state = request.app.state

    def portable(session: Session, worker: Worker) -> tuple[service.Acquired, bool]:
        acquired = service.acquire(session, state.store, state.settings, worker, body)
        return acquired, worker.status == "active"

    async def common_case(pool: AsyncConnectionPool, digest: str) -> tuple[service.Acquired, bool]:
        return await fast.acquire(pool, state.store, state.settings, digest, body), True

    return await answer(request, credentials, "acquire", common_case, portable)


async def heartbeat(
    request: Request, credentials: Credentials, lease_id: uuid.UUID, body: HeartbeatRequest
) -> HeartbeatResponse:
    return await answer(
        request,
        credentials,
        "heartbeat",
        lambda pool, digest: fast.heartbeat(pool, digest, lease_id, body),
        lambda session, worker: service.heartbeat(session, worker, lease_id, body),
    )


async def heartbeats(
    request: Request, credentials: Credentials, body: HeartbeatsRequest
) -> HeartbeatsResponse:
    """Several leases' heartbeats, each answered on its own, in lease-id order: on the event
    loop each is the single heartbeat (its own statement, or handed to the portable path);
    without an async pool, one transaction with a savepoint per lease (service.heartbeats).
    Each lease counts as one heartbeat call on the path that answered it."""
    state = request.app.state
    if state.pg_pool is None:
        try:
            return await as_worker(
                request,
                credentials,
                lambda session, worker: service.heartbeats(session, worker, body),
            )
        finally:
            state.call_paths[("heartbeat", PORTABLE)] += len(body.leases)
    answers: dict[uuid.UUID, LeaseBeatAnswer] = {}
    for beat in sorted(body.leases, key=lambda b: b.lease_id):
        answers[beat.lease_id] = await _one_beat(request, credentials, beat)
    return HeartbeatsResponse(results=[answers[b.lease_id] for b in body.leases])


async def _one_beat(request: Request, credentials: Credentials, beat: LeaseBeat) -> LeaseBeatAnswer:
    single = HeartbeatRequest(fencing=beat.fencing)
    try:
        answer = await heartbeat(request, credentials, beat.lease_id, single)
    except (NotFound, FencingLost) as refused:
        return service.refused_beat(beat.lease_id, refused)
    return LeaseBeatAnswer(lease_id=beat.lease_id, status=200, heartbeat=answer)


async def upload(
    request: Request, credentials: Credentials, lease_id: uuid.UUID, body: UploadRequest
) -> UploadResponse:
    state = request.app.state
    return await answer(
        request,
        credentials,
        "upload",
        lambda pool, digest: fast.upload(pool, state.store, state.settings, digest, lease_id, body),
        lambda session, worker: service.upload(
            session, state.store, state.settings, worker, lease_id, body
        ),
    )


async def complete(
    request: Request, credentials: Credentials, lease_id: uuid.UUID, body: CompleteRequest
) -> CompleteResponse:
    store = request.app.state.store
    return await answer(
        request,
        credentials,
        "complete",
        lambda pool, digest: fast.complete(pool, store, digest, lease_id, body),
        lambda session, worker: service.complete(session, store, worker, lease_id, body),
    )
