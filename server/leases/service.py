"""The lease engine's acquire (docs/architecture/lease-engine.md, "The lease engine"; invariants 1,
2, 6, 25, 26): one try authenticates, marks the worker seen and reads its candidate runs in one
statement, and grants from the fairest run whose environment it can run, by the run's grant order of
the ledger's kinds (server/leases/ledger.py). Written once for both databases; where their SQL
differs, server/leases/statements.py says so in one helper per statement."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from typing import Any, NoReturn

from sqlalchemy.orm import Session

from protocol import layout
from protocol.capabilities import LoraShape, why_cannot_serve
from protocol.environments import SINGLE_TURN, worker_can_run
from protocol.error_codes import ErrorCode
from protocol.run_config import RunConfig
from protocol.schemas import AdapterFile, AdapterRef, Lease, LeaseAcquireRequest, LeasePrompt
from protocol.storage import ObjectStore
from server.config import Settings
from server.errors import Conflict, FencingLost, NotFound
from server.leases import expiry, fair_share, ledger, queue, statements
from server.leases import repository as repo
from server.leases.kinds import WorkKind
from server.leases.runs_of_leases import LEASE_RUNS
from server.leases.units import WorkerDb
from server.runs import service as runs
from server.tokens.service import digest_of_bearer
from server.workers.service import worker_for_token

lease_seed = queue.lease_seed


@dataclass(frozen=True)
class Caller:
    """A worker call: the engine's database, the bucket, the settings and the bearer token."""

    db: WorkerDb
    store: ObjectStore
    settings: Settings
    token: str

    @property
    def digest(self) -> str:
        """The token's digest (401 for a string that is none of our tokens)."""
        return digest_of_bearer(self.token)


@dataclass(frozen=True)
class Acquired:
    """One acquire try: the lease granted (or None), and the current version of every running
    run of the worker's base models (the answer's X-Asyncgrpo-Versions header)."""

    lease: Lease | None
    versions: dict[uuid.UUID, int]


async def acquire(caller: Caller, body: LeaseAcquireRequest) -> tuple[Acquired, bool]:
    """One try: a grant from the fairest admissible run (or none), and whether the worker is
    active (an inactive one gets no lease however long it waits)."""
    db = caller.db
    seen = await statements.seen_for_acquire(
        db, caller.digest, body.models, body.environments, body.capabilities
    )
    if seen is None:
        return await _not_seen(caller, body)
    runs = seen.runs
    if seen.any_expired:  # invariant 4: in its own transaction, before any grant
        await db.unit(expiry.sweep_expired)
        runs = [replace(run, has_queued=True) for run in runs]  # the sweep may have queued rows
    versions = {run.id: run.current_version for run in runs}
    declared = declared_environments(seen.environments, None)
    for run in runs:
        if body.models is not None and run.base_model not in body.models:
            continue
        config = await config_of_run(db, run.id)
        if not worker_can_run(config.environment, declared, seen.trusted):
            continue  # the run waits for a worker that can run its environment
        if why_cannot_serve(config.lora, seen.capabilities) is not None:
            continue  # nor can its engine load the run's adapter (the run says so: serving.py)
        lease = await _grant(caller, run, seen.worker_id, config)
        if lease is not None:
            return Acquired(lease, versions), True
    return Acquired(None, versions), True


async def _not_seen(caller: Caller, body: LeaseAcquireRequest) -> tuple[Acquired, bool]:
    """Why the try's statement matched nothing: the token's refusal (401/403), an inactive
    worker (no lease), or a model the worker did not register (409)."""

    def read(session: Session) -> tuple[str, list[str]]:
        worker = worker_for_token(session, caller.token)
        return worker.status, list(worker.models or [])

    status, served = await caller.db.unit(read)
    if status != "active":
        return Acquired(None, {}), False
    _refuse_unregistered_models(served, body.models)
    return Acquired(None, {}), True  # changed meanwhile: the long-poll tries again


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


async def config_of_run(db: WorkerDb, run_id: uuid.UUID) -> RunConfig:
    """The run's parsed config: this process's cache, else read (and parsed) in a unit."""
    config = runs.cached_config(run_id)
    if config is None:
        config = await db.unit(lambda session: runs.config_of(session, run_id))
    return config


async def _grant(
    caller: Caller, run: statements.CandidateRun, worker_id: uuid.UUID, config: RunConfig
) -> Lease | None:
    """A lease of the run: its kinds in the run's grant order, the first that grants."""
    for kind in ledger.grant_order(config, run.status, run.fencing_seq):
        lease = await _grant_kind(caller, kind, run, worker_id, config)
        if lease is not None:
            return lease
    return None


async def _grant_kind(
    caller: Caller,
    kind: WorkKind,
    run: statements.CandidateRun,
    worker_id: uuid.UUID,
    config: RunConfig,
) -> Lease | None:
    lease_id = uuid.uuid4()
    window_s = fair_share.waiting_window_s(caller.settings.lease_long_poll_s)
    granted = await kind.grant(caller.db, run, worker_id, lease_id, config, window_s)
    if granted is None:
        return None
    LEASE_RUNS.remember(lease_id, run.id, kind.name)
    return lease_response(
        caller.store, caller.settings, run.id, run.base_model, config, lease_id, granted, kind
    )


def lease_response(
    store: ObjectStore,
    settings: Settings,
    run_id: uuid.UUID,
    base_model: str,
    config: RunConfig,
    lease_id: uuid.UUID,
    granted: queue.Granted,
    kind: WorkKind,
) -> Lease:
    """What the worker is told about a lease it was just granted (of any kind)."""
    sampling, group_size = kind.sampling(config)
    return Lease(
        lease_id=lease_id,
        kind=kind.name,  # type: ignore[arg-type]
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
        adapter=adapter_ref(store, settings, run_id, granted.version, granted.adapter),
        fencing=granted.fencing,
        ttl_s=config.lease_ttl_s,
        heartbeat_interval_s=config.heartbeat_interval_s,
        batch_key=layout.batch_key(run_id, lease_id, granted.fencing),
        environment=config.environment.model_dump(mode="json"),
        lora=LoraShape(rank=config.lora.rank, target_modules=list(config.lora.target_modules)),
    )


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


# -- the refusals of the fenced calls ----------------------------------------------------------


async def refuse(caller: Caller, lease_id: uuid.UUID) -> NoReturn:
    """Why a fenced call's compare-and-set matched nothing, in the order every call checks it:
    the token (401/403), a lease this worker does not hold (404), or a lost lease (409). Runs
    in a unit of its own, after the call's unit has ended."""

    def read(session: Session) -> Any:
        worker = worker_for_token(session, caller.token)
        return repo.lease_of_worker(session, lease_id, worker.id)

    lease = await caller.db.unit(read)
    if lease is None:
        raise NotFound("lease not found", code=ErrorCode.lease_not_found)
    raise lease_lost()


def lease_lost() -> FencingLost:
    """The 409 of a fenced call whose compare-and-set refused: the worker drops the work."""
    return FencingLost(
        "lease lost: fencing token, state or expiry no longer holds; drop the work",
        code=ErrorCode.fencing_lost,
    )
