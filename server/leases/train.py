"""The training kind of the work ledger (server/leases/kinds.py): prompt rows of the run's
dataset epochs (server/leases/queue.py), granted within the run's admission bound and the
worker's fair share, aborted by a heartbeat once the run stops running or the lease's version
leaves the staleness window (with admission control on)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, and_, case, null
from sqlalchemy.orm import Session

from protocol.run_config import RunConfig
from protocol.schemas import TRAIN_KIND
from protocol.staleness import outside_window
from server.leases import fair_share, queue, statements
from server.leases import repository as repo
from server.leases.units import WorkerDb
from server.wakeups import LEARNER, after_commit
from server.workers.repository import touch

UNLIMITED_GROUPS = queue.INT_MAX  # the admission bound of a run with admission control off


def admission_bound(config: RunConfig) -> int:
    """The run's admission bound, unlimited when the run turned admission control off (for
    benchmarks)."""
    return config.admission_bound_groups() if config.admission_control else UNLIMITED_GROUPS


class TrainKind:
    name: str = TRAIN_KIND
    trained = True

    def offered(self, config: RunConfig, run_status: str) -> bool:
        return run_status == queue.GRANTING

    def goes_first(self, fencing_seq: int) -> bool:
        return False

    async def grant(
        self,
        db: WorkerDb,
        run: Any,
        worker_id: uuid.UUID,
        lease_id: uuid.UUID,
        config: RunConfig,
        waiting_window_s: float,
    ) -> queue.Granted | None:
        if not run.has_queued:  # rows queued after the try's read signal its waiters again
            return None
        bound = admission_bound(config)
        worker_cap = await fair_share.cap(
            db,
            run_id=run.id,
            base_model=run.base_model,
            worker_id=worker_id,
            bound=bound,
            in_flight=run.groups_in_flight,
            n=config.prompts_per_lease,
            window_s=waiting_window_s,
        )
        params = queue.grant_params(
            run_id=run.id,
            worker_id=worker_id,
            lease_id=lease_id,
            n=config.prompts_per_lease,
            bound=bound,
            ttl_s=config.lease_ttl_s,
            group_size=config.group_size,
            run_seed=config.seed,
            worker_cap=worker_cap,
        )
        return await statements.grant_rows(db, params)

    def sampling(self, config: RunConfig) -> tuple[dict[str, Any], int]:
        return config.sampling.model_dump(mode="json"), config.group_size

    def abort_reason(
        self,
        run_status: Any,
        current_version: Any,
        adapter_version: Any,
        admission: Any,
        max_staleness: Any,
    ) -> ColumnElement[Any]:
        return case(
            (run_status != queue.GRANTING, "run_" + run_status),
            (
                and_(admission, outside_window(current_version, adapter_version, max_staleness)),
                "stale",
            ),
            else_=null(),
        )

    def counts_abort(self, reason: str) -> bool:
        return reason == "stale"  # a run that stopped running (paused, cancelled…) counts none

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
        rows = repo.leased_rows_of(session, lease_ids)
        named = set(only or ())
        guilty = [r for r in rows if r in named] if named else rows
        innocent = [r for r in rows if r not in guilty]
        result = queue.requeue(session, run_id, guilty, reason, count_attempt=count_attempt)
        back = queue.requeue(session, run_id, innocent, reason, count_attempt=False)
        return len(result.requeued) + len(back.requeued)

    def retained_versions(self, run_id: uuid.UUID) -> Any:
        return None  # its versions are those of its leases and batches

    def requeue_batch(
        self, session: Session, run_id: uuid.UUID, batch_id: uuid.UUID, reason: str
    ) -> tuple[int, int]:
        rows = repo.rows_of_batch(session, batch_id)
        result = queue.requeue(session, run_id, rows, reason, count_attempt=True)
        return len(result.requeued), len(result.dropped)

    async def accept_held(
        self, db: WorkerDb, digest: str, lease_id: uuid.UUID, fencing: int, values: dict[str, Any]
    ) -> uuid.UUID | None:
        return await statements.accept_in_one_statement(db, digest, lease_id, fencing, values)

    async def complete(
        self,
        db: WorkerDb,
        lease: Any,
        fencing: int,
        values: dict[str, Any],
        reject: str | None,
    ) -> tuple[uuid.UUID, str | None] | None:
        return await db.unit(
            lambda session: _complete_steps(session, lease, fencing, values, reject)
        )


def _complete_steps(
    session: Session, lease: Any, fencing: int, values: dict[str, Any], reject: str | None
) -> tuple[uuid.UUID, str | None] | None:
    """complete step by step: SQLite, a rejection, or whatever the one statement refused."""
    ended = repo.end_values("completed", "completed")
    if not repo.fence(session, lease.id, lease.worker_id, fencing, **ended):
        return None
    rows = repo.leased_rows_of(session, [lease.id])
    if reject is None and values["n_samples"] != len(rows) * lease.group_size:
        reject = "invalid"
    batch_id = repo.insert_batch(
        session,
        **values,
        run_id=lease.run_id,
        lease_id=lease.id,
        worker_id=lease.worker_id,
        adapter_version=lease.adapter_version,
        n_groups=len(rows),
        tokenizer_fingerprint=lease.tokenizer_fingerprint,
        state="rejected" if reject else "accepted",
        reject_reason=reject,
    )
    if reject is None:
        repo.accept_rows(session, rows, batch_id)
        touch(session, lease.worker_id, accepted_batches=1)
        after_commit(session, LEARNER)
    else:
        queue.requeue(session, lease.run_id, rows, "invalid", count_attempt=True)
        touch(session, lease.worker_id, rejected_batches=1)
    return batch_id, reject


TRAIN = TrainKind()
