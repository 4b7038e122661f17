"""HTTP layer of evaluation during training: the admin read of the results per version (the
learner's eval claims and results are learner calls: server/learner/eval_router.py)."""

from __future__ import annotations

import uuid

from fastapi import APIRouter

from server.evals import service
from server.evals.schemas import EvalsOut, EvalVersionOut
from server.request_deps import SessionDep
from server.routing import TransactionalRoute
from server.tokens.access import RunReader

router = APIRouter(prefix="/api/v1/runs/{run_id}", tags=["evals"], route_class=TransactionalRoute)


@router.get("/evals", response_model=EvalsOut)
def get_evals(run_id: uuid.UUID, session: SessionDep, _caller: RunReader) -> EvalsOut:
    """Eval results per version: mean reward, accuracy, pass@n (pending until scored)."""
    config, results = service.results(session, run_id)
    ev = config.eval
    return EvalsOut(
        run_id=run_id,
        enabled=ev is not None,
        every_versions=ev.every_versions if ev else None,
        n=ev.n if ev else None,
        accuracy_reward=ev.accuracy_reward if ev else None,
        threshold=ev.threshold if ev else None,
        versions=[EvalVersionOut.model_validate(r) for r in results],
    )
