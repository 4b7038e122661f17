"""The lease engine's fenced calls (docs/architecture/lease-engine.md, "The lease engine";
invariants 2, 6, 10): heartbeat, upload, complete and release of a lease the worker holds. Each is
one compare-and-set on the lease row in database time (repository.fence's rule), inside one unit;
when it changes nothing the call answers 404 or 409 (service.refuse says which) and has changed
nothing. What the lease's rows do next is its kind's business (server/leases/ledger.py)."""

from __future__ import annotations

import uuid
from functools import cache
from typing import Any

from anyio import to_thread
from sqlalchemy import bindparam, update
from sqlalchemy.orm import Session

from protocol import layout
from protocol.error_codes import ErrorCode
from protocol.schemas import (
    ATTEMPT_COUNTING_RELEASES,
    CompleteRequest,
    CompleteResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    HeartbeatsRequest,
    HeartbeatsResponse,
    LeaseBeatAnswer,
    ReleaseRequest,
    ReleaseResponse,
    UploadRequest,
    UploadResponse,
)
from protocol.storage import ObjectStore
from server.db_types import db_now
from server.errors import FencingLost, NotFound, PayloadTooLarge, Unprocessable
from server.leases import ledger, statements
from server.leases import repository as repo
from server.leases.kinds import WorkKind
from server.leases.runs_of_leases import LEASE_RUNS
from server.leases.service import Caller, config_of_run, lease_lost, refuse
from server.leases.units import Statement
from server.models import Lease, Worker
from server.workers.repository import authenticated, touch


@cache
def _beat_of(kinds: tuple[WorkKind, ...]) -> Statement:
    return statements.beat_statement(ledger.abort_reason(kinds))


def _beat() -> Statement:
    """The heartbeat's unit over every registered kind's abort reason, built once per set of
    kinds: a kind registered after the first heartbeat gets its own branch at the next."""
    return _beat_of(tuple(ledger.KINDS.values()))


# -- heartbeat ---------------------------------------------------------------------------------


async def heartbeat(
    caller: Caller, lease_id: uuid.UUID, body: HeartbeatRequest
) -> HeartbeatResponse:
    """Extend the lease by the run's TTL, or abort it (its rows back to their queue) when its
    kind says so: the run no longer runs, or (training) its version left the window."""
    db = caller.db
    run_id = await LEASE_RUNS.run_of(db, lease_id)
    if run_id is None:
        await refuse(caller, lease_id)
    config = await config_of_run(db, run_id)
    params = {
        "digest": caller.digest,
        "lease_id": lease_id,
        "held_fencing": body.fencing,
        "ttl_s": config.lease_ttl_s,
        "admission": config.admission_control,
        "max_staleness": config.max_staleness,
    }
    beat = await statements.beat(db, _beat(), params)
    if beat is None:
        await refuse(caller, lease_id)
    if beat.extended:
        return HeartbeatResponse(
            current_version=beat.current_version, abort=False, ttl_s=config.lease_ttl_s
        )
    if not beat.held or beat.reason is None:
        raise lease_lost()
    await caller.db.unit(lambda session: _abort(session, lease_id, beat, body.fencing))
    return HeartbeatResponse(
        current_version=beat.current_version, abort=True, ttl_s=0.0, reason=beat.reason
    )


def _abort(session: Session, lease_id: uuid.UUID, beat: statements.Beat, fencing: int) -> None:
    """End the held lease `aborted` with the heartbeat's reason, its rows back by its kind."""
    assert beat.reason is not None
    kind = ledger.kind_of(beat.kind)
    ended = repo.end_values("aborted", beat.reason)
    if not repo.fence(session, lease_id, beat.worker_id, fencing, **ended):
        raise lease_lost()
    counted = kind.counts_abort(beat.reason)
    kind.requeue(session, beat.run_id, [lease_id], "aborted", count_attempt=counted)
    touch(session, beat.worker_id)


async def heartbeats(caller: Caller, body: HeartbeatsRequest) -> HeartbeatsResponse:
    """Each lease's heartbeat on its own, as its single heartbeat would answer, in lease-id
    order (two such calls never lock in a cycle): one lost lease (404, 409) changes nothing of
    it and does not stop the others."""
    answers: dict[uuid.UUID, LeaseBeatAnswer] = {}
    for beat in sorted(body.leases, key=lambda b: b.lease_id):
        single = HeartbeatRequest(fencing=beat.fencing)
        try:
            answer = await heartbeat(caller, beat.lease_id, single)
        except (NotFound, FencingLost) as refused:
            answers[beat.lease_id] = LeaseBeatAnswer(
                lease_id=beat.lease_id,
                status=refused.status_code,
                detail=refused.message,
                code=refused.code,
            )
            continue
        answers[beat.lease_id] = LeaseBeatAnswer(
            lease_id=beat.lease_id, status=200, heartbeat=answer
        )
    return HeartbeatsResponse(results=[answers[b.lease_id] for b in body.leases])


# -- upload ------------------------------------------------------------------------------------

_UPLOADING_STATEMENT = (
    update(Lease)
    .where(
        Lease.id == bindparam("lease_id"),
        Lease.worker_id == Worker.id,
        authenticated(bindparam("digest")),
        statements.held_now(),
    )
    .values(last_heartbeat_at=db_now())
    .returning(Lease.run_id, Lease.fencing)
    .execution_options(synchronize_session=False)
)
_UPLOADING = Statement.of(_UPLOADING_STATEMENT)
_LEASE_OF_CALLER = Statement.of(repo.lease_of_caller())


async def upload(caller: Caller, lease_id: uuid.UUID, body: UploadRequest) -> UploadResponse:
    """A presigned PUT for the lease's one batch key, bound to this size and sha256."""
    limit = caller.settings.security.max_blob_bytes
    if body.size > limit:
        await _lease_of(caller, lease_id)  # 401/404 come first
        raise PayloadTooLarge(
            f"size exceeds {limit} bytes", field="size", code=ErrorCode.upload_too_large
        )
    params = {"digest": caller.digest, "lease_id": lease_id, "held_fencing": body.fencing}
    row = await caller.db.first(_UPLOADING, params)
    if row is None:
        await refuse(caller, lease_id)
    key = layout.batch_key(row.run_id, lease_id, row.fencing)
    ttl = caller.settings.security.url_ttl_s
    put = caller.store.presign_put(
        key, size=body.size, sha256_hex=body.sha256, ttl_s=ttl, if_none_match=True
    )
    return UploadResponse(key=key, url=put.url, headers=dict(put.headers), expires_in_s=ttl)


# -- complete ----------------------------------------------------------------------------------


async def _lease_of(caller: Caller, lease_id: uuid.UUID) -> Any:
    """The lease as this authenticated worker holds it (any state), else the refusal."""
    params = {"digest": caller.digest, "lease_id": lease_id}
    lease = await caller.db.first(_LEASE_OF_CALLER, params)
    if lease is None:
        await refuse(caller, lease_id)
    return lease


def _refuse_unsigned_digest(store: ObjectStore, key: str, claimed: str) -> None:
    """The manifest's sha256 must be the one the upload URL was signed with (the store kept it
    when it enforced it): 422, the lease untouched, so the worker can complete again."""
    stored = store.sha256(key)
    if stored is not None and stored != claimed:
        raise Unprocessable(
            f"manifest.sha256 {claimed} is not the sha256 the batch was uploaded with ({stored})",
            field="manifest.sha256",
            code=ErrorCode.digest_mismatch,
        )


async def complete(caller: Caller, lease_id: uuid.UUID, body: CompleteRequest) -> CompleteResponse:
    """Accept the batch when its object exists with the manifest's size and the sample count
    matches; otherwise reject it and re-queue the prompts. The lease ends `completed` either way.
    The common case — a lease this process granted, its batch in order — is accepted in one
    statement where the kind has one; anything else takes the steps, checked in order."""
    batch_id = await _accept_in_order(caller, lease_id, body)
    if batch_id is not None:
        return CompleteResponse(batch_id=batch_id, state="accepted", reject_reason=None)
    lease = await _lease_of(caller, lease_id)
    key = _key_of_manifest(lease.run_id, lease_id, lease.fencing, body)
    reject = await _object_rejection(caller.store, key, body)
    values = _batch_values(key, body)
    kind = ledger.kind_of(lease.kind)
    if reject is None:  # a lease another server process granted
        batch_id = await kind.accept_held(caller.db, caller.digest, lease_id, body.fencing, values)
        if batch_id is not None:
            return CompleteResponse(batch_id=batch_id, state="accepted", reject_reason=None)
    done = await kind.complete(caller.db, lease, body.fencing, values, reject)
    if done is None:
        raise lease_lost()
    batch_id, reject = done
    return CompleteResponse(
        batch_id=batch_id, state="rejected" if reject else "accepted", reject_reason=reject
    )


async def _accept_in_order(
    caller: Caller, lease_id: uuid.UUID, body: CompleteRequest
) -> uuid.UUID | None:
    """The accepted batch's id when the lease is one this process granted and its batch is in
    order (its key, its object, its digest); None, changing nothing, otherwise."""
    known = LEASE_RUNS.known(lease_id)
    if known is None:
        return None
    run_id, kind = known
    key = layout.batch_key(run_id, lease_id, body.fencing)
    if body.manifest.key != key:
        return None
    try:
        if await _object_rejection(caller.store, key, body) is not None:
            return None
    except Unprocessable:
        return None  # the steps say so, in their order
    values = _batch_values(key, body)
    return await ledger.kind_of(kind).accept_held(
        caller.db, caller.digest, lease_id, body.fencing, values
    )


def _key_of_manifest(
    run_id: uuid.UUID, lease_id: uuid.UUID, fencing: int, body: CompleteRequest
) -> str:
    key = layout.batch_key(run_id, lease_id, fencing)
    if body.manifest.key != key:
        raise Unprocessable(
            "manifest.key is not this lease's batch key",
            field="manifest.key",
            code=ErrorCode.wrong_batch_key,
        )
    return key


async def _object_rejection(store: ObjectStore, key: str, body: CompleteRequest) -> str | None:
    """Why the batch object is rejected (missing, another size), or None; 422 when its digest
    is not the one its upload was signed with. The bucket's I/O runs off the event loop."""
    manifest = body.manifest
    info = await to_thread.run_sync(store.head, key)
    if info is None:
        return "missing_object"
    if info.size != manifest.size:
        return "size_mismatch"
    await to_thread.run_sync(_refuse_unsigned_digest, store, key, manifest.sha256)
    return None


def _batch_values(key: str, body: CompleteRequest) -> dict[str, Any]:
    """The batch row's columns from the manifest."""
    manifest = body.manifest
    return {
        "bucket_key": key,
        "sha256": manifest.sha256,
        "bytes": manifest.size,
        "n_samples": manifest.n_samples,
        "n_tokens": manifest.n_tokens,
        "generation_seconds": manifest.generation_seconds,
        "manifest": manifest.model_dump(mode="json"),
    }


# -- release -----------------------------------------------------------------------------------


async def release(caller: Caller, lease_id: uuid.UUID, body: ReleaseRequest) -> ReleaseResponse:
    """Rows back to the front of the queue now; an attempt counted only when the engine died
    generating them (`prompt_too_long`: only the rows named)."""
    lease = await _lease_of(caller, lease_id)
    reason = body.reason or "release"
    kind = ledger.kind_of(lease.kind)
    only = body.prompt_row_ids if reason == "prompt_too_long" else None
    counted = reason in ATTEMPT_COUNTING_RELEASES

    def releasing(session: Session) -> int:
        ended = repo.end_values("released", reason)
        if not repo.fence(session, lease_id, lease.worker_id, body.fencing, **ended):
            raise lease_lost()
        released = kind.requeue(
            session, lease.run_id, [lease_id], reason, count_attempt=counted, only=only
        )
        touch(session, lease.worker_id)
        return released

    return ReleaseResponse(released=await caller.db.unit(releasing))
