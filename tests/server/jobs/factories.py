"""Rows for the jobs tests, made through the real services where they exist (create_run,
the lease engine's acquire) and through the models otherwise."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from protocol.run_config import RunConfig
from protocol.schemas import LeaseAcquireRequest
from protocol.storage import ObjectStore
from server.config import Settings
from server.db_types import db_now, db_now_plus
from server.models import Lease, RolloutBatch, Run, Worker
from tests.harness.runs import jsonl, plus_rows, run_config

BASE_MODEL = "smollm2-135m-instruct"


def new_run(
    session: Session,
    *,
    status: str = "running",
    n_rows: int = 4,
    budget_usd: float | None = None,
    learner_price_per_hour: float = 0.0,
    alarms: dict[str, Any] | None = None,
) -> Run:
    from server.runs.service import create_run

    config = RunConfig.model_validate(
        run_config(
            name=f"jobs-{uuid.uuid4().hex[:6]}",
            base_model=BASE_MODEL,
            dataset=jsonl(plus_rows(n_rows)),
            lease_ttl_s=600.0,
            max_staleness=4,
            budget_usd=budget_usd,
            learner_price_per_hour=learner_price_per_hour,
            alarms=alarms or {},
        )
    )
    run, _token = create_run(session, config)
    session.execute(update(Run).where(Run.id == run.id).values(status=status))
    session.flush()
    session.refresh(run)
    return run


def new_worker(
    session: Session, *, price: float = 1.0, gpu_type: str = "cpu", name: str | None = None
) -> Worker:
    worker = Worker(
        name=name or f"w-{uuid.uuid4().hex[:6]}",
        gpu_type=gpu_type,
        gpu_count=1,
        price_per_hour=price,
        models=[BASE_MODEL],
        last_seen_at=db_now(),
    )
    session.add(worker)
    session.flush()
    session.refresh(worker)
    return worker


def worker_caller(session: Session, store: ObjectStore, settings: Settings, worker: Worker) -> Any:
    """The lease engine's caller (server/leases/service.Caller) for the worker, with a fresh
    worker token, whose units run on the session's connection, each a savepoint of the session's
    transaction, so that they see its rows and it sees theirs (objects the session already holds
    keep their attributes until refreshed). It has no async pool (a pooled connection could
    not see the test's uncommitted rows)."""
    from server.leases.service import Caller
    from server.leases.units import WorkerDb
    from server.tokens import service as tokens

    token = tokens.mint(session, "worker", name=worker.name, scope_id=worker.id).plaintext
    session.flush()
    units = sessionmaker(
        bind=session.connection(), join_transaction_mode="create_savepoint", expire_on_commit=False
    )
    db = WorkerDb(units, postgres=session.get_bind().dialect.name == "postgresql")
    return Caller(db, store, settings, token)


def engine_call(call: Any) -> Any:
    """Run one of the lease engine's (async) calls to its answer, from a test's thread."""
    import anyio

    return anyio.run(lambda: call)


def acquire(
    session: Session, store: ObjectStore, settings: Settings, worker: Worker
) -> uuid.UUID | None:
    """A real lease from the lease engine (one acquire try, as the worker); its id, or None
    when nothing is admissible."""
    from server.leases.service import acquire as engine_acquire

    caller = worker_caller(session, store, settings, worker)
    acquired, _active = engine_call(engine_acquire(caller, LeaseAcquireRequest()))
    return acquired.lease.lease_id if acquired.lease is not None else None


def expire(session: Session, lease_id: uuid.UUID) -> None:
    session.execute(update(Lease).where(Lease.id == lease_id).values(expires_at=db_now_plus(-1.0)))


def add_batch(
    session: Session, run: Run, worker: Worker, lease_id: uuid.UUID | None, **fields: Any
) -> RolloutBatch:
    """A batch row of the lease: 2 groups, 4 samples at version 0 unless `fields` say else."""
    values: dict[str, Any] = {
        "adapter_version": 0,
        "bucket_key": f"k/{lease_id}",
        "sha256": "0" * 64,
        "bytes": 1,
        "n_samples": 4,
        "n_tokens": 40,
        "n_groups": 2,
        **fields,
    }
    batch = RolloutBatch(run_id=run.id, lease_id=lease_id, worker_id=worker.id, **values)
    session.add(batch)
    session.flush()
    return batch
