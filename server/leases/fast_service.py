"""The worker calls' common case on Postgres, answered on the event loop through psycopg's
async pool: a live worker acquiring while no lease has expired, and heartbeating, uploading and
completing (with an accepted batch) a lease it holds. One short transaction per call, two to
three round trips, no request thread (bench/leases.py: the thread hops and SQLAlchemy's ORM
were most of a lease cycle's cost).

Anything else raises `Fallback` with nothing changed, and the call is answered by the portable
path (service.py), which stays the reference for every rule: a bad or revoked token, another
worker's lease, a heartbeat that must abort, an oversized upload, a batch to reject, expired
leases to sweep, a quarantined worker, a run whose config this process has not parsed yet.
Errors whose answer is the same on both paths (409 fencing lost, 422 wrong batch key) are
raised here directly.
"""

from __future__ import annotations

import uuid
from collections import Counter

from anyio import to_thread
from psycopg_pool import AsyncConnectionPool

from protocol import layout
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
from server.leases import fast_repository as fast_repo
from server.leases import service
from server.runs import service as runs


class Fallback(Exception):
    """Not the common case: answer the call on the portable path."""


class CallPaths(Counter[tuple[str, str]]):
    """How many worker calls each path answered, by (call, path): exported on /metrics."""


async def acquire(
    pool: AsyncConnectionPool,
    store: ObjectStore,
    settings: Settings,
    digest: str,
    body: LeaseAcquireRequest,
) -> Lease | None:
    """One try: grant from the fairest admissible run, or None."""
    async with pool.connection() as conn:
        found = await fast_repo.worker_and_runs(conn, digest)
        if found is None or found.status != "active" or found.any_expired:
            raise Fallback
        lease = None
        for run in found.runs:
            if body.models is not None and run["base_model"] not in body.models:
                continue
            run_id = uuid.UUID(run["id"])
            config = runs.cached_config(run_id)
            if config is None:
                raise Fallback
            params = service.grant_params(config, run_id, found.worker_id)
            granted = await fast_repo.grant(conn, params)
            if granted is not None:
                lease = service.lease_response(
                    store, settings, run_id, run["base_model"], config, params["lease_id"], granted
                )
                break
        await fast_repo.touch_worker(conn, found.worker_id)
    return lease


async def heartbeat(
    pool: AsyncConnectionPool, digest: str, lease_id: uuid.UUID, body: HeartbeatRequest
) -> HeartbeatResponse:
    async with pool.connection() as conn:
        lease = await fast_repo.lease_of_worker(conn, digest, lease_id)
        config = None if lease is None else runs.cached_config(lease.run_id)
        if lease is None or config is None:
            raise Fallback
        if service.abort_reason(
            lease.run_status, lease.current_version, lease.adapter_version, config
        ):
            raise Fallback
        ttl_s = config.lease_ttl_s
        if not await fast_repo.extend(conn, lease_id, lease.worker_id, body.fencing, ttl_s):
            raise service.fencing_lost()
    return HeartbeatResponse(current_version=lease.current_version, abort=False, ttl_s=ttl_s)


async def upload(
    pool: AsyncConnectionPool,
    store: ObjectStore,
    settings: Settings,
    digest: str,
    lease_id: uuid.UUID,
    body: UploadRequest,
) -> UploadResponse:
    ttl = settings.security.url_ttl_s
    async with pool.connection() as conn:
        lease = await fast_repo.lease_of_worker(conn, digest, lease_id)
        if lease is None or body.size > settings.security.max_blob_bytes:
            raise Fallback
        if not await fast_repo.mark_uploading(conn, lease_id, lease.worker_id, body.fencing):
            raise service.fencing_lost()
        key = layout.batch_key(lease.run_id, lease_id, lease.fencing)
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
    async with pool.connection() as conn:
        lease = await fast_repo.lease_of_worker(conn, digest, lease_id)
        if lease is None:
            raise Fallback
        key = service.checked_batch_key(lease.run_id, lease_id, lease.fencing, manifest.key)
        info = await to_thread.run_sync(store.head, key)  # the bucket's I/O off the event loop
        if service.reject_reason(info, manifest, lease.n_prompts, lease.group_size):
            raise Fallback
        batch_id = uuid.uuid4()
        batch = {
            "batch_id": batch_id,
            "key": key,
            "sha256": manifest.sha256,
            "bytes": manifest.size,
            "n_samples": manifest.n_samples,
            "n_tokens": manifest.n_tokens,
            "n_groups": lease.n_prompts,
            "fingerprint": lease.tokenizer_fingerprint,
            "generation_seconds": manifest.generation_seconds,
            "manifest": manifest.model_dump(mode="json"),
        }
        fenced, accepted = await fast_repo.accept(
            conn, lease_id, lease.worker_id, body.fencing, batch
        )
        if not fenced:
            raise service.fencing_lost()
        if accepted != lease.n_prompts:
            raise Fallback  # rows left the lease some other way: the reference path decides
    return CompleteResponse(batch_id=batch_id, state="accepted", reject_reason=None)
