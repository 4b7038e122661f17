"""Runs API (admin and project tokens, server/tokens/access.py): create, list, read with live
stats, pause / resume / cancel."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, status

from protocol.run_config import RunConfig
from protocol.schemas import BIGINT_MAX
from server.audit.recorder import AuditDep
from server.deps import SessionDep, SettingsDep
from server.projects import service as projects
from server.projects.params import ProjectQuery
from server.routing import TransactionalRoute
from server.runs import lifecycle, service
from server.runs.schemas import RunAction, RunCreated, RunDetail, RunOut, RunStatus
from server.tokens.access import Caller, Reader, RunCreator, RunReader, run_allowed
from server.tokens.roles import RUN_ACTIONS
from server.wake import wake

router = APIRouter(prefix="/api/v1/runs", tags=["runs"], route_class=TransactionalRoute)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=RunCreated)
def create_run(
    config: RunConfig,
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    caller: RunCreator,
    audit: AuditDep,
    project: ProjectQuery = None,
) -> RunCreated:
    """Create a run (pending until its learner attaches; on an uploaded or hf dataset,
    `preparing` until its prompt rows are made); the learner token is shown once."""
    config = service.with_checked_webhook(config, settings.outbound_policy())
    service.check_judge_urls(config, settings.outbound_policy())
    project_id = projects.resolve_for(session, caller, project)
    run, learner_token = service.create_run(
        session, config, project_id=project_id, created_by=caller.token.id
    )
    audit.record(session, caller.token, "run", run.id)
    silent_s = settings.jobs.worker_silent_s
    created = RunCreated(run=service.detail(session, run, silent_s), learner_token=learner_token)
    if run.status == "preparing":
        session.commit()  # the job must see the run
        wake(request.app.state, "datasets", "run_prep")
    return created


@router.get("", response_model=list[RunOut])
def list_runs(
    session: SessionDep,
    caller: Reader,
    status: Annotated[RunStatus | None, Query(description="Only runs in this state.")] = None,
    limit: Annotated[int, Query(ge=1, le=500, description="Page size.")] = 100,
    offset: Annotated[
        int, Query(ge=0, le=BIGINT_MAX, description="Runs to skip (newest first).")
    ] = 0,
    project: ProjectQuery = None,
) -> list[RunOut]:
    """Runs, newest first, optionally of one status and of one project (a project token's:
    its project's only)."""
    project_id = projects.listing_scope(session, caller, project)
    return service.list_runs(session, status, limit, offset, project_id)


@router.get("/{run_id}", response_model=RunDetail)
def get_run(
    run_id: uuid.UUID, session: SessionDep, settings: SettingsDep, _caller: RunReader
) -> RunDetail:
    """One run with its config and live figures, and `serving` when no live worker can serve
    it (no_worker_can_serve)."""
    run = service.get_run(session, run_id)
    return service.detail(session, run, settings.jobs.worker_silent_s)


def _reason(reason: str | None) -> dict[str, str] | None:
    return None if reason is None else {"reason": reason}


def _action(action: str):  # type: ignore[no-untyped-def]
    def handler(
        run_id: uuid.UUID,
        session: SessionDep,
        settings: SettingsDep,
        audit: AuditDep,
        body: RunAction | None = None,
        caller: Caller = Depends(run_allowed(RUN_ACTIONS[action])),  # noqa: B008
    ) -> RunDetail:
        reason = body.reason if body is not None else None
        run = lifecycle.admin_action(session, run_id, action, reason)
        audit.record(session, caller.token, "run", run.id, detail=_reason(reason))
        return service.detail(session, run, settings.jobs.worker_silent_s)

    handler.__name__ = f"{action}_run"
    return handler


for _name in lifecycle.ADMIN_ACTIONS:
    router.add_api_route(
        f"/{{run_id}}/{_name}",
        _action(_name),
        methods=["POST"],
        response_model=RunDetail,
        summary=f"{_name.capitalize()} a run",
        description=f"The run lifecycle: {lifecycle.describe()}. "
        "409 when the run is not in one of the action's from-states, 404 for an unknown run.",
    )
