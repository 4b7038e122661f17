"""Rules of the worker side of the rollout proxy (invariants 1–6, 10).

Every fenced call is one compare-and-set on the lease row (repository.fence); when it changes
nothing the call answers 409 and has changed nothing before it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from protocol import layout
from protocol.environments import SINGLE_TURN, worker_can_run
from protocol.error_codes import ErrorCode
from protocol.run_config import RunConfig
from protocol.schemas import (
    ATTEMPT_COUNTING_RELEASES,
    INT_MAX,
    LEASING_RUN_STATUSES,
    AdapterFile,
    AdapterRef,
    BatchManifest,
    CompleteRequest,
    CompleteResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    HeartbeatsRequest,
    HeartbeatsResponse,
    Lease,
    LeaseAcquireRequest,
    LeaseBeatAnswer,
    LeaseKind,
    LeasePrompt,
    ReleaseRequest,
    ReleaseResponse,
    UploadRequest,
    UploadResponse,
)
from protocol.seeds import derived_seed
from protocol.staleness import outside_window
from protocol.storage import ObjectStore
from server.config import Settings
from server.db import is_postgres
from server.db_types import db_now, db_now_plus
from server.errors import Conflict, FencingLost, NotFound, PayloadTooLarge, Unprocessable
from server.evals import service as evals
from server.leases import expiry, fair_share, queue
from server.leases import repository as repo
from server.models import Run, Worker
from server.runs import service as runs
from server.workers import repository as workers_repo

UNLIMITED_GROUPS = INT_MAX  # the admission bound of a run with admission_control off


def admission_bound(config: RunConfig) -> int:
    """The run's admission bound, unlimited when the run turned admission control off (for
    benchmarks)."""
    return config.admission_bound_groups() if config.admission_control else UNLIMITED_GROUPS


def lease_seed(run_seed: int, run_id: uuid.UUID, fencing: int) -> int:
    """Deterministic per grant: the run's seed and the grant's fencing token (the one-statement
    grant computes the same in SQL: server/leases/queue.py, protocol/seeds.py)."""
    return derived_seed(run_seed, run_id, fencing)


# -- acquire -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Acquired:
    """One acquire try: the lease granted (or None), and the current version of every running
    run of the worker's base models (the answer's X-Asyncgrpo-Versions header)."""

    lease: Lease | None
    versions: dict[uuid.UUID, int]


def acquire(
    session: Session,
    store: ObjectStore,
    settings: Settings,
    worker: Worker,
    body: LeaseAcquireRequest,
) -> Acquired:
    """One try: sweep expired leases, then grant from the fairest admissible run, or None."""
    expiry.sweep_expired(session)
    if worker.status != "active":
        return Acquired(None, {})
    served = list(worker.models or [])
    _refuse_unregistered_models(served, body.models)
    models = served if body.models is None else [m for m in body.models if m in served]
    declared = declared_environments(worker.environments, body.environments)
    candidates = repo.candidate_runs(session, served)
    lease = None
    for run in candidates:
        if run.base_model not in models:
            continue
        config = runs.config_of(session, run.id)
        if not worker_can_run(config.environment, declared, worker.trusted):
            continue  # the run waits for a worker that can run its environment
        lease = _grant(session, store, settings, run, worker.id)
        if lease is not None:
            break
    # Lock order everywhere: lease -> prompt rows -> run -> worker (the worker row last), so
    # an acquire and a sweep or fenced call never wait on each other in a cycle.
    workers_repo.touch(session, worker.id, waiting=lease is None, environments=body.environments)
    return Acquired(lease, {run.id: run.current_version for run in candidates})


def declared_environments(stored: list[str] | None, asked: list[str] | None) -> list[str]:
    """What the worker can run for this try: what it declares now, else what it declared
    before (a worker that never declared any: single_turn)."""
    if asked is not None:
        return asked
    return list(stored) if stored is not None else [SINGLE_TURN]


def _refuse_unregistered_models(served: list[str], asked: list[str] | None) -> None:
    """A worker asks for the model it runs (--model); one it did not register with (a token
    file reused after a change of --model) would never get a lease: say so."""
    unregistered = [m for m in asked or [] if m not in served]
    if unregistered:
        raise Conflict(
            f"this worker asks for leases of {unregistered[0]!r} (--model) but registered with "
            f"{served!r}: run it with that model, or register it again (remove its token file "
            "and give a registration token)",
            registered_models=served,
            models=unregistered,
            code=ErrorCode.model_not_registered,
        )


def grant_params(
    config: RunConfig, run_id: uuid.UUID, worker_id: uuid.UUID, worker_cap: int
) -> dict[str, Any]:
    """The one-statement grant's parameters for a new lease of this run to this worker."""
    return queue.grant_params(
        run_id=run_id,
        worker_id=worker_id,
        lease_id=uuid.uuid4(),
        n=config.prompts_per_lease,
        bound=admission_bound(config),
        ttl_s=config.lease_ttl_s,
        group_size=config.group_size,
        run_seed=config.seed,
        worker_cap=worker_cap,
    )


def _grant(
    session: Session, store: ObjectStore, settings: Settings, run: Run, worker_id: uuid.UUID
) -> Lease | None:
    """A lease of the run, by the grant policy (server/evals/service.py, EVAL_TURN): training
    first while it is admissible, except on every EVAL_TURN-th grant, and eval when training
    has nothing admissible; an evaluating run hands out eval leases only."""
    config = runs.config_of(session, run.id)
    if config.eval is None:
        return _grant_train(session, store, settings, run, worker_id, config)
    if run.status == "evaluating" or evals.eval_first(run.fencing_seq):
        lease = _grant_eval(session, store, settings, run, worker_id, config)
        if lease is not None or run.status == "evaluating":
            return lease
    lease = _grant_train(session, store, settings, run, worker_id, config)
    if lease is None:
        lease = _grant_eval(session, store, settings, run, worker_id, config)
    return lease


def _grant_eval(
    session: Session,
    store: ObjectStore,
    settings: Settings,
    run: Run,
    worker_id: uuid.UUID,
    config: RunConfig,
) -> Lease | None:
    lease_id = uuid.uuid4()
    granted = evals.grant(
        session,
        run.id,
        worker_id,
        lease_id,
        config,
        lambda fencing: lease_seed(config.seed, run.id, fencing),
    )
    if granted is None:
        return None
    return lease_response(
        store, settings, run.id, run.base_model, config, lease_id, granted, kind="eval"
    )


def _grant_train(
    session: Session,
    store: ObjectStore,
    settings: Settings,
    run: Run,
    worker_id: uuid.UUID,
    config: RunConfig,
) -> Lease | None:
    if run.status != "running":
        return None
    cap = fair_share.cap(
        session,
        run_id=run.id,
        base_model=run.base_model,
        worker_id=worker_id,
        bound=admission_bound(config),
        in_flight=run.groups_in_flight,
        n=config.prompts_per_lease,
        window_s=fair_share.waiting_window_s(settings.lease_long_poll_s),
    )
    if is_postgres(session):
        params = grant_params(config, run.id, worker_id, cap)
        granted = queue.grant_in_one_statement(session, params)
        lease_id = params["lease_id"]
    else:
        lease_id = uuid.uuid4()
        granted = _grant_portable(session, run.id, worker_id, lease_id, config, cap)
    if granted is None:
        return None
    return lease_response(store, settings, run.id, run.base_model, config, lease_id, granted)


def lease_response(
    store: ObjectStore,
    settings: Settings,
    run_id: uuid.UUID,
    base_model: str,
    config: RunConfig,
    lease_id: uuid.UUID,
    granted: queue.Granted,
    kind: LeaseKind = "train",
) -> Lease:
    """What the worker is told about a lease it was just granted (training or eval)."""
    sampling, group_size = _sampling_of(config, kind)
    return Lease(
        lease_id=lease_id,
        kind=kind,
        run_id=run_id,
        base_model=base_model,
        tokenizer_fingerprint=granted.fingerprint,
        sampling=sampling,
        max_new_tokens=sampling["max_new_tokens"],
        system_prompt=config.grpo.system_prompt,
        group_size=group_size,
        prompts=[
            LeasePrompt(
                prompt_row_id=r.id,
                dataset_row_id=r.dataset_row_id,
                prompt=r.prompt,
                epoch=r.epoch,
            )
            for r in granted.rows
        ],
        seed=granted.seed,
        adapter_version=granted.version,
        adapter=_adapter_ref(store, settings, run_id, granted),
        fencing=granted.fencing,
        ttl_s=config.lease_ttl_s,
        heartbeat_interval_s=config.heartbeat_interval_s,
        batch_key=layout.batch_key(run_id, lease_id, granted.fencing),
        environment=config.environment.model_dump(mode="json"),
    )


def _sampling_of(config: RunConfig, kind: LeaseKind) -> tuple[dict[str, Any], int]:
    """A lease's sampling and group size: the run's, or for eval its own temperature,
    max_new_tokens (else the run's) and n."""
    sampling = config.sampling.model_dump(mode="json")
    if kind == "train":
        return sampling, config.group_size
    ev = config.eval
    assert ev is not None
    max_new = ev.max_new_tokens or config.sampling.max_new_tokens
    return {**sampling, "temperature": ev.temperature, "max_new_tokens": max_new}, ev.n


def _grant_portable(
    session: Session,
    run_id: uuid.UUID,
    worker_id: uuid.UUID,
    lease_id: uuid.UUID,
    config: RunConfig,
    worker_cap: int,
) -> queue.Granted | None:
    """The grant statement by statement (SQLite, whose single writer already serialises)."""
    rows = repo.lock_queued_rows(session, run_id, config.prompts_per_lease)
    if not rows:
        return None
    bound = admission_bound(config)
    admitted = queue.admit(
        session, run_id, len(rows), bound, worker_id=worker_id, worker_cap=worker_cap
    )
    if admitted is None:
        return None
    fencing, version, fingerprint = admitted
    seed = lease_seed(config.seed, run_id, fencing)
    repo.insert_lease(
        session,
        id=lease_id,
        run_id=run_id,
        worker_id=worker_id,
        adapter_version=version,
        fencing=fencing,
        state="active",
        expires_at=db_now_plus(config.lease_ttl_s),
        seed=seed,
        n_prompts=len(rows),
        group_size=config.group_size,
    )
    repo.mark_rows_leased(session, [r.id for r in rows], lease_id)
    adapter = repo.adapter_version(session, run_id, version) if version > 0 else None
    return queue.Granted(
        fencing=fencing,
        seed=seed,
        version=version,
        fingerprint=fingerprint,
        rows=list(rows),
        adapter=None if adapter is None else (adapter.sha256, adapter.files),
    )


def _adapter_ref(
    store: ObjectStore, settings: Settings, run_id: uuid.UUID, granted: queue.Granted
) -> AdapterRef | None:
    return adapter_ref(store, settings, run_id, granted.version, granted.adapter)


def adapter_ref(
    store: ObjectStore,
    settings: Settings,
    run_id: uuid.UUID,
    version: int,
    adapter: tuple[str, dict[str, Any]] | None,
) -> AdapterRef | None:
    """What a worker is told to download for this version of the run (None for version 0):
    the version's adapter row (sha256, files) with presigned download URLs."""
    if version == 0:
        return None
    if adapter is None:
        raise RuntimeError(f"run {run_id} is at version {version} but has no adapter row")
    sha256, files = adapter
    ttl = settings.security.url_ttl_s
    return AdapterRef(
        version=version,
        sha256=sha256,
        files=[
            AdapterFile(
                name=name,
                url=store.presign_get(meta["key"], ttl),
                sha256=meta["sha256"],
                size=meta.get("bytes"),
            )
            for name, meta in sorted(files.items())
        ],
    )


# -- fenced calls ------------------------------------------------------------------------------


def _lease(session: Session, lease_id: uuid.UUID, worker: Worker) -> Any:
    lease = repo.lease_of_worker(session, lease_id, worker.id)
    if lease is None:
        raise NotFound("lease not found", code=ErrorCode.lease_not_found)
    return lease


def _fence(
    session: Session, lease_id: uuid.UUID, worker: Worker, fencing: int, **values: Any
) -> None:
    """The compare-and-set every fenced call goes through; 409 when it changed nothing."""
    if not repo.fence(session, lease_id, worker.id, fencing, **values):
        raise FencingLost(
            "lease lost: fencing token, state or expiry no longer holds; drop the work",
            code=ErrorCode.fencing_lost,
        )


def heartbeat(
    session: Session, worker: Worker, lease_id: uuid.UUID, body: HeartbeatRequest
) -> HeartbeatResponse:
    """Extend the lease by the run's TTL, or abort it (and re-queue its rows) when its batch can
    no longer be admissible or the run no longer runs."""
    answer = _beat(session, worker, lease_id, body.fencing)
    workers_repo.touch(session, worker.id)
    return answer


def heartbeats(session: Session, worker: Worker, body: HeartbeatsRequest) -> HeartbeatsResponse:
    """Each lease's heartbeat on its own, in a savepoint: one lost lease (404, 409) changes
    nothing of it and does not stop the others. Leases are taken in lease-id order, so two
    such requests never lock in a cycle, and the worker row is touched once, last (the lock
    order of every call: leases first, the worker row last)."""
    answers: dict[uuid.UUID, LeaseBeatAnswer] = {}
    for beat in sorted(body.leases, key=lambda b: b.lease_id):
        try:
            with session.begin_nested():
                answer = _beat(session, worker, beat.lease_id, beat.fencing)
            answers[beat.lease_id] = LeaseBeatAnswer(
                lease_id=beat.lease_id, status=200, heartbeat=answer
            )
        except (NotFound, FencingLost) as refused:
            answers[beat.lease_id] = refused_beat(beat.lease_id, refused)
    workers_repo.touch(session, worker.id)
    return HeartbeatsResponse(results=[answers[b.lease_id] for b in body.leases])


def refused_beat(lease_id: uuid.UUID, refused: NotFound | FencingLost) -> LeaseBeatAnswer:
    return LeaseBeatAnswer(
        lease_id=lease_id, status=refused.status_code, detail=refused.message, code=refused.code
    )


def _beat(session: Session, worker: Worker, lease_id: uuid.UUID, fencing: int) -> HeartbeatResponse:
    """The heartbeat's rule, without touching the worker row."""
    lease = _lease(session, lease_id, worker)
    config = runs.config_of(session, lease.run_id)
    ttl_s = config.lease_ttl_s
    reason = None
    if lease.kind == "eval":  # pinned to its version: never stale
        if lease.status not in LEASING_RUN_STATUSES:
            reason = f"run_{lease.status}"
    elif lease.status != "running":
        reason = f"run_{lease.status}"
    elif config.admission_control and outside_window(
        lease.current_version, lease.adapter_version, config.max_staleness
    ):
        reason = "stale"
    if reason is None:
        _fence(session, lease_id, worker, fencing, **repo.extend_values(ttl_s))
        return HeartbeatResponse(current_version=lease.current_version, abort=False, ttl_s=ttl_s)
    _fence(session, lease_id, worker, fencing, **repo.end_values("aborted", reason))
    if lease.kind == "eval":
        evals.requeue_leases(session, [lease_id], count_attempt=False)
        return HeartbeatResponse(
            current_version=lease.current_version, abort=True, ttl_s=0.0, reason=reason
        )
    rows = repo.leased_rows(session, lease_id)
    # A stale lease counts an attempt; a run that stopped running (paused, cancelled…) does not.
    queue.requeue(session, lease.run_id, rows, "aborted", count_attempt=reason == "stale")
    return HeartbeatResponse(
        current_version=lease.current_version, abort=True, ttl_s=0.0, reason=reason
    )


def upload(
    session: Session,
    store: ObjectStore,
    settings: Settings,
    worker: Worker,
    lease_id: uuid.UUID,
    body: UploadRequest,
) -> UploadResponse:
    """A presigned PUT for the lease's one batch key, bound to this size and sha256."""
    lease = _lease(session, lease_id, worker)
    if body.size > settings.security.max_blob_bytes:
        raise PayloadTooLarge(
            f"size exceeds {settings.security.max_blob_bytes} bytes",
            field="size",
            code=ErrorCode.upload_too_large,
        )
    _fence(session, lease_id, worker, body.fencing, last_heartbeat_at=db_now())
    key = layout.batch_key(lease.run_id, lease_id, lease.fencing)
    ttl = settings.security.url_ttl_s
    put = store.presign_put(
        key, size=body.size, sha256_hex=body.sha256, ttl_s=ttl, if_none_match=True
    )
    return UploadResponse(key=key, url=put.url, headers=dict(put.headers), expires_in_s=ttl)


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


def complete(
    session: Session, store: ObjectStore, worker: Worker, lease_id: uuid.UUID, body: CompleteRequest
) -> CompleteResponse:
    """Accept the batch when its object exists with the manifest's size and the sample count
    matches; otherwise reject it and re-queue the prompts. The lease ends `completed` either way."""
    lease = _lease(session, lease_id, worker)
    manifest = body.manifest
    key = layout.batch_key(lease.run_id, lease_id, lease.fencing)
    if manifest.key != key:
        raise Unprocessable(
            "manifest.key is not this lease's batch key",
            field="manifest.key",
            code=ErrorCode.wrong_batch_key,
        )
    info = store.head(key)  # object-store I/O before the compare-and-set takes the row lock
    if info is not None and info.size == manifest.size:  # else rejected below as it was
        _refuse_unsigned_digest(store, key, manifest.sha256)
    _fence(session, lease_id, worker, body.fencing, **repo.end_values("completed", "completed"))
    reject = None
    if info is None:
        reject = "missing_object"
    elif info.size != manifest.size:
        reject = "size_mismatch"
    if lease.kind == "eval":
        return _complete_eval(session, worker, lease, manifest, key, reject)
    rows = repo.leased_rows(session, lease_id)
    if reject is None and manifest.n_samples != len(rows) * lease.group_size:
        reject = "invalid"
    batch_id = repo.insert_batch(
        session,
        run_id=lease.run_id,
        lease_id=lease_id,
        worker_id=worker.id,
        adapter_version=lease.adapter_version,
        bucket_key=key,
        sha256=manifest.sha256,
        bytes=manifest.size,
        n_samples=manifest.n_samples,
        n_tokens=manifest.n_tokens,
        n_groups=len(rows),
        tokenizer_fingerprint=lease.tokenizer_fingerprint,
        state="rejected" if reject else "accepted",
        reject_reason=reject,
        generation_seconds=manifest.generation_seconds,
        manifest=manifest.model_dump(mode="json"),
    )
    if reject is None:
        repo.accept_rows(session, rows, batch_id)
        workers_repo.touch(session, worker.id, accepted_batches=1)
    else:
        queue.requeue(session, lease.run_id, rows, "invalid", count_attempt=True)
        workers_repo.touch(session, worker.id, rejected_batches=1)
    return CompleteResponse(
        batch_id=batch_id, state="rejected" if reject else "accepted", reject_reason=reject
    )


def _complete_eval(
    session: Session,
    worker: Worker,
    lease: Any,
    manifest: BatchManifest,
    key: str,
    reject: str | None,
) -> CompleteResponse:
    batch_id, reject = evals.accept(
        session,
        lease,
        worker.id,
        {
            "bucket_key": key,
            "sha256": manifest.sha256,
            "bytes": manifest.size,
            "n_samples": manifest.n_samples,
            "n_tokens": manifest.n_tokens,
            "generation_seconds": manifest.generation_seconds,
            "manifest": manifest.model_dump(mode="json"),
        },
        reject,
    )
    if reject:
        workers_repo.touch(session, worker.id, rejected_batches=1)
    else:
        workers_repo.touch(session, worker.id, accepted_batches=1)
    return CompleteResponse(
        batch_id=batch_id, state="rejected" if reject else "accepted", reject_reason=reject
    )


def release(
    session: Session, worker: Worker, lease_id: uuid.UUID, body: ReleaseRequest
) -> ReleaseResponse:
    """Prompts back to the front of the queue now; an attempt counted only when the engine died
    generating them."""
    lease = _lease(session, lease_id, worker)
    reason = body.reason or "release"
    _fence(session, lease_id, worker, body.fencing, **repo.end_values("released", reason))
    counted = reason in ATTEMPT_COUNTING_RELEASES
    if lease.kind == "eval":
        released = evals.requeue_leases(session, [lease_id], count_attempt=counted)
        workers_repo.touch(session, worker.id)
        return ReleaseResponse(released=released)
    rows = repo.leased_rows(session, lease_id)
    named = set(body.prompt_row_ids or ()) if reason == "prompt_too_long" else set()
    guilty = [r for r in rows if r in named] if named else rows
    innocent = [r for r in rows if r not in guilty]
    result = queue.requeue(session, lease.run_id, guilty, reason, count_attempt=counted)
    back = queue.requeue(session, lease.run_id, innocent, reason, count_attempt=False)
    workers_repo.touch(session, worker.id)
    return ReleaseResponse(released=len(result.requeued) + len(back.requeued))
