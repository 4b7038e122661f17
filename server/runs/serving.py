"""Whether a leasing run has a live worker that can serve it (docs/architecture/lease-engine.md,
"Workers that can serve the run"): when every live worker of its base model that can run its
environment declared an engine that cannot load its adapter (protocol/capabilities.py), the
run says so in its API and on its page, with the reason and the setting to raise. The grant
applies the same rule (server/leases/service.py acquire), so such a run gets no lease."""

from __future__ import annotations

from sqlalchemy.orm import Session

from protocol.capabilities import NO_WORKER_CAN_SERVE, WorkerCapabilities, why_cannot_serve
from protocol.environments import SINGLE_TURN, worker_can_run
from protocol.run_config import RunConfig
from protocol.schemas import LEASING_RUN_STATUSES
from server.db import db_time
from server.models import Run
from server.runs.schemas import ServingProblem
from server.workers import repository as workers
from server.workers.liveness import worker_state


def serving_problem(
    session: Session, run: Run, config: RunConfig, silent_s: float
) -> ServingProblem | None:
    """`no_worker_can_serve` with its reason; None when a live worker can serve the run, when
    none is live (nothing is known of what would come), or when the run hands out no leases."""
    if run.status not in LEASING_RUN_STATUSES:
        return None
    now = db_time(session)
    reasons: list[str] = []
    for worker in workers.list_all(session):
        if worker_state(worker.status, worker.last_seen_at, now, silent_s) != "online":
            continue
        if run.base_model not in (worker.models or ()):
            continue
        declared = list(worker.environments or [SINGLE_TURN])
        if not worker_can_run(config.environment, declared, worker.trusted):
            continue
        caps = None if worker.capabilities is None else WorkerCapabilities(**worker.capabilities)
        reason = why_cannot_serve(config.lora, caps)
        if reason is None:
            return None
        reasons.append(reason)
    if not reasons:
        return None
    return ServingProblem(
        code=NO_WORKER_CAN_SERVE,
        reason=f"none of the {len(reasons)} live worker(s) of {run.base_model} can load this "
        f"run's adapter: {reasons[0]}",
        workers=len(reasons),
    )
