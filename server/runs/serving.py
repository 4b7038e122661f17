"""Whether a leasing run has a live worker that can serve it (docs/architecture/lease-engine.md,
"Workers that can serve the run"; invariant 27), the one home of `no_worker_can_serve`: when
the run's base model has live workers of its project or the shared fleet (invariant 28;
online: active and seen within settings.jobs.worker_silent_s) and none of them can serve it —
none can run its environment (protocol/environments.py worker_can_run), or none of those that
can has an engine that loads its adapter (protocol/capabilities.py why_cannot_serve) — the
run's API answer and its page say so, with the reason and the setting to change. The grant
applies the same rules (server/leases/service.py acquire), so such a run gets no lease. With
no live worker at all it says nothing: nothing is known of what will come."""

from __future__ import annotations

from sqlalchemy.orm import Session

from protocol.capabilities import (
    NO_WORKER_CAN_SERVE,
    WorkerCapabilities,
    stored_capabilities,
    why_none_can_serve,
)
from protocol.environments import SINGLE_TURN, EnvironmentConfig, declared_allows, worker_can_run
from protocol.run_config import RunConfig
from protocol.schemas import LEASING_RUN_STATUSES
from server.db import db_time
from server.models import Run, Worker
from server.runs.schemas import ServingProblem
from server.workers import repository as workers
from server.workers.liveness import worker_state


def declared_environments(worker: Worker) -> list[str]:
    """What the worker declared it can run (one that never declared any: single_turn)."""
    return list(worker.environments or [SINGLE_TURN])


def declared_capabilities(worker: Worker) -> WorkerCapabilities | None:
    """What the worker declared its engine can load (None: never declared, it serves every
    run)."""
    return stored_capabilities(worker.capabilities)


def serving_problem(
    session: Session, run: Run, config: RunConfig, silent_s: float
) -> ServingProblem | None:
    """`no_worker_can_serve` with its reason; None when a live worker can serve the run, when
    none is live, or when the run hands out no leases."""
    if run.status not in LEASING_RUN_STATUSES:
        return None
    now = db_time(session)
    live = [
        w
        for w in workers.active_of_model(session, run.base_model, run.project_id)
        if worker_state(w.status, w.last_seen_at, now, silent_s) == "online"
    ]
    if not live:
        return None
    env = config.environment
    able = [w for w in live if worker_can_run(env, declared_environments(w), w.trusted)]
    if able:
        reason = why_none_can_serve(config.lora, [declared_capabilities(w) for w in able])
        if reason is None:
            return None
    else:
        reason = _environment_reason(env, live)
    return ServingProblem(
        code=NO_WORKER_CAN_SERVE,
        reason=f"no live worker of {run.base_model} can serve this run "
        f"({_workers(len(live))}): {reason}",
        workers=len(live),
    )


def _environment_reason(env: EnvironmentConfig, live: list[Worker]) -> str:
    """Why none of the live workers can run the environment: none declared it, or none of
    those that did is trusted while it requires a trusted worker."""
    declared = [w for w in live if declared_allows(declared_environments(w), env.name)]
    if not declared:
        return (
            f"environment {env.name!r} is declared by none of them (allow it where the workers "
            "run: worker --environment-modules, or an installed entry point of the group "
            "asyncgrpo.environments)"
        )
    return (
        f"environment {env.name!r} requires a trusted worker and none of the "
        f"{_workers(len(declared))} that declared it is trusted (POST "
        "/api/v1/workers/{id}/trust)"
    )


def _workers(n: int) -> str:
    return f"{n} live worker" + ("" if n == 1 else "s")
