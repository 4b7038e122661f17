"""The eval kind of the work ledger (server/leases/kinds.py): eval items of the versions due
(server/evals/service.py), granted under the run's own eval bound (`eval.max_leases_in_flight`),
never the admission counter nor the worker's fair share; pinned to the version under
evaluation, so a heartbeat aborts one only when the run stops handing out leases, never as
stale; its items go back to the eval queue (dropped after max_attempts)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, and_, case, null, select
from sqlalchemy.orm import Session

from protocol.run_config import RunConfig
from protocol.schemas import LEASING_RUN_STATUSES
from server.evals import service
from server.leases import repository as leases_repo
from server.leases.queue import Granted, lease_seed
from server.leases.units import WorkerDb
from server.models import EvalResult
from server.workers.repository import touch


class EvalKind:
    name = service.KIND
    trained = False  # scored, never trained on

    def offered(self, config: RunConfig, run_status: str) -> bool:
        return config.eval is not None and run_status in LEASING_RUN_STATUSES

    def goes_first(self, fencing_seq: int) -> bool:
        return service.eval_first(fencing_seq)

    async def grant(
        self,
        db: WorkerDb,
        run: Any,
        worker_id: uuid.UUID,
        lease_id: uuid.UUID,
        config: RunConfig,
        waiting_window_s: float,
    ) -> Granted | None:
        def granting(session: Session) -> Granted | None:
            granted = service.grant(
                session,
                run.id,
                worker_id,
                lease_id,
                config,
                lambda fencing: lease_seed(config.seed, run.id, fencing),
            )
            if granted is not None:
                touch(session, worker_id, waiting=False)
            return granted

        return await db.unit(granting)

    def sampling(self, config: RunConfig) -> tuple[dict[str, Any], int]:
        ev = config.eval
        assert ev is not None
        max_new = ev.max_new_tokens or config.sampling.max_new_tokens
        sampling = config.sampling.model_dump(mode="json")
        return {**sampling, "temperature": ev.temperature, "max_new_tokens": max_new}, ev.n

    def abort_reason(
        self,
        run_status: Any,
        current_version: Any,
        adapter_version: Any,
        admission: Any,
        max_staleness: Any,
    ) -> ColumnElement[Any]:
        stopped = and_(*(run_status != status for status in LEASING_RUN_STATUSES))
        return case((stopped, "run_" + run_status), else_=null())

    def counts_abort(self, reason: str) -> bool:
        return False

    def requeue(
        self,
        session: Session,
        run_id: uuid.UUID,
        lease_ids: Sequence[uuid.UUID],
        reason: str,
        *,
        count_attempt: bool,
        only: Sequence[int] | None = None,
    ) -> int:
        return service.requeue_leases(session, lease_ids, count_attempt=count_attempt)

    def retained_versions(self, run_id: uuid.UUID) -> Any:
        """A version whose eval is pending: its leases still need the version's files."""
        return select(EvalResult.version).where(
            EvalResult.run_id == run_id, EvalResult.state == "pending"
        )

    def requeue_batch(
        self, session: Session, run_id: uuid.UUID, batch_id: uuid.UUID, reason: str
    ) -> tuple[int, int]:
        return service.requeue_batch(session, batch_id), 0

    async def accept_held(
        self, db: WorkerDb, digest: str, lease_id: uuid.UUID, fencing: int, values: dict[str, Any]
    ) -> uuid.UUID | None:
        return None  # eval's accept scores items: always the steps

    async def complete(
        self,
        db: WorkerDb,
        lease: Any,
        fencing: int,
        values: dict[str, Any],
        reject: str | None,
    ) -> tuple[uuid.UUID, str | None] | None:
        return await db.unit(lambda session: _complete(session, lease, fencing, values, reject))


def _complete(
    session: Session, lease: Any, fencing: int, values: dict[str, Any], reject: str | None
) -> tuple[uuid.UUID, str | None] | None:
    ended = leases_repo.end_values("completed", "completed")
    if not leases_repo.fence(session, lease.id, lease.worker_id, fencing, **ended):
        return None
    batch_id, reject = service.accept(session, lease, lease.worker_id, values, reject)
    if reject:
        touch(session, lease.worker_id, rejected_batches=1)
    else:
        touch(session, lease.worker_id, accepted_batches=1)
    return batch_id, reject


EVAL = EvalKind()
