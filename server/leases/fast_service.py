"""The worker calls' common case on Postgres, answered on the event loop through psycopg's
async pool: a live, active worker acquiring while no lease has expired, and heartbeating,
uploading and completing (with a batch to accept) a lease it holds. Each write is one
autocommitted statement (fast_repository.py): heartbeat, upload and complete are one round
trip each, acquire two, and no request thread is involved (bench/leases.py: the thread hops,
the ORM and the BEGIN/COMMIT round trips were most of a lease cycle's cost).

Anything else raises `Fallback` with nothing changed, and paths.py hands the call to the
portable path (service.py), which stays the reference for every rule and every refusal: a bad or
revoked token, another worker's lease, a lost fencing token, a heartbeat that must abort, an
oversized upload, a batch to reject, expired leases to sweep, a quarantined worker, a run whose
config this process has not parsed yet.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from typing import Any

from anyio import to_thread
from psycopg_pool import AsyncConnectionPool

from protocol import layout
from protocol.environments import worker_can_run
from protocol.schemas import (
    CompleteRequest,
    CompleteResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    Lease,
    LeaseAcquireRequest,
    UploadRequest,
    UploadResponse,
)
from protocol.storage import ObjectStore
from server.config import Settings
from server.leases import fair_share, service
from server.leases import fast_repository as fast_repo
from server.runs import service as runs


class Fallback(Exception):
    """Not the common case: answer the call on the portable path."""


class LeaseRuns:
    """lease id → run id, which never changes: the fenced calls need the run's config before
    their one statement. Filled by grants on this process; a miss costs one lookup. Used on
    the event loop only (no lock)."""

    def __init__(self, max_size: int = 65536) -> None:
        self._runs: OrderedDict[uuid.UUID, uuid.UUID] = OrderedDict()
        self._max_size = max_size

    def remember(self, lease_id: uuid.UUID, run_id: uuid.UUID) -> None:
        self._runs[lease_id] = run_id
        if len(self._runs) > self._max_size:
            self._runs.popitem(last=False)

    async def run_of(self, pool: AsyncConnectionPool, lease_id: uuid.UUID) -> uuid.UUID:
        run_id = self._runs.get(lease_id)
        if run_id is None:
            async with pool.connection() as conn:
                run_id = await fast_repo.run_of_lease(conn, lease_id)
            if run_id is None:
                raise Fallback
            self.remember(lease_id, run_id)
        return run_id


LEASE_RUNS = LeaseRuns()


async def acquire(
    pool: AsyncConnectionPool,
    store: ObjectStore,
    settings: Settings,
    digest: str,
    body: LeaseAcquireRequest,
) -> service.Acquired:
    """One try: a grant from the fairest admissible run (or none), with the current versions
    of the worker's runs."""
    async with pool.connection() as conn:
        found = await fast_repo.seen_for_acquire(conn, digest, body.models, body.environments)
        if found is None or found.any_expired:
            raise Fallback
        versions = {uuid.UUID(run["id"]): int(run["current_version"]) for run in found.runs}
        for run in found.runs:
            if body.models is not None and run["base_model"] not in body.models:
                continue
            lease = await _grant(conn, store, settings, run, found)
            if lease is not None:
                return service.Acquired(lease, versions)
    return service.Acquired(None, versions)


async def _grant(
    conn: fast_repo.Conn,
    store: ObjectStore,
    settings: Settings,
    run: dict[str, Any],
    found: Any,
) -> Lease | None:
    run_id = uuid.UUID(run["id"])
    worker_id = found.worker_id
    config = runs.cached_config(run_id)
    if config is None:
        raise Fallback
    if not worker_can_run(config.environment, found.environments, found.trusted):
        return None  # the run waits for a worker that can run its environment
    if config.eval is not None:
        raise Fallback  # eval's grant policy is on the portable path (server/evals/service.py)
    cap = await fair_share.cap_async(
        conn,
        run_id=run_id,
        base_model=run["base_model"],
        worker_id=worker_id,
        bound=service.admission_bound(config),
        in_flight=int(run["groups_in_flight"]),
        n=config.prompts_per_lease,
        window_s=fair_share.waiting_window_s(settings.lease_long_poll_s),
    )
    params = service.grant_params(config, run_id, worker_id, cap)
    granted = await fast_repo.grant(conn, params)
    if granted is None:
        return None
    LEASE_RUNS.remember(params["lease_id"], run_id)
    return service.lease_response(
        store, settings, run_id, run["base_model"], config, params["lease_id"], granted
    )


async def heartbeat(
    pool: AsyncConnectionPool, digest: str, lease_id: uuid.UUID, body: HeartbeatRequest
) -> HeartbeatResponse:
    config = runs.cached_config(await LEASE_RUNS.run_of(pool, lease_id))
    if config is None:
        raise Fallback
    async with pool.connection() as conn:
        version = await fast_repo.extend(
            conn,
            digest,
            lease_id,
            body.fencing,
            ttl_s=config.lease_ttl_s,
            admission=config.admission_control,
            max_staleness=config.max_staleness,
        )
    if version is None:
        raise Fallback
    return HeartbeatResponse(current_version=version, abort=False, ttl_s=config.lease_ttl_s)


async def upload(
    pool: AsyncConnectionPool,
    store: ObjectStore,
    settings: Settings,
    digest: str,
    lease_id: uuid.UUID,
    body: UploadRequest,
) -> UploadResponse:
    if body.size > settings.security.max_blob_bytes:
        raise Fallback
    run_id = await LEASE_RUNS.run_of(pool, lease_id)
    async with pool.connection() as conn:
        if not await fast_repo.mark_uploading(conn, digest, lease_id, body.fencing):
            raise Fallback
    key = layout.batch_key(run_id, lease_id, body.fencing)  # the held lease's own token
    ttl = settings.security.url_ttl_s
    put = store.presign_put(
        key, size=body.size, sha256_hex=body.sha256, ttl_s=ttl, if_none_match=True
    )
    return UploadResponse(key=key, url=put.url, headers=dict(put.headers), expires_in_s=ttl)


async def complete(
    pool: AsyncConnectionPool,
    store: ObjectStore,
    digest: str,
    lease_id: uuid.UUID,
    body: CompleteRequest,
) -> CompleteResponse:
    manifest = body.manifest
    run_id = await LEASE_RUNS.run_of(pool, lease_id)
    key = layout.batch_key(run_id, lease_id, body.fencing)
    if manifest.key != key:
        raise Fallback
    info = await to_thread.run_sync(store.head, key)  # the bucket's I/O off the event loop
    if info is None or info.size != manifest.size:
        raise Fallback
    stored = await to_thread.run_sync(store.sha256, key)
    if stored is not None and stored != manifest.sha256:
        raise Fallback  # the portable path answers (422 for a digest that was not signed)
    batch_id = uuid.uuid4()
    batch = {
        "batch_id": batch_id,
        "key": key,
        "sha256": manifest.sha256,
        "bytes": manifest.size,
        "n_samples": manifest.n_samples,
        "n_tokens": manifest.n_tokens,
        "generation_seconds": manifest.generation_seconds,
        "manifest": manifest.model_dump(mode="json"),
    }
    async with pool.connection() as conn:
        if not await fast_repo.accept(conn, digest, lease_id, body.fencing, batch):
            raise Fallback
    return CompleteResponse(batch_id=batch_id, state="accepted", reject_reason=None)
