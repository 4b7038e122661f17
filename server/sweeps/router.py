"""Sweeps API (admin and project tokens, server/tokens/access.py): create a sweep of runs from a
base config and a grid (or a list of overrides), list and read sweeps with their runs, pause /
resume / cancel every run of one."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, status

from protocol.schemas import BIGINT_MAX
from server.audit.recorder import AuditDep
from server.deps import SessionDep, SettingsDep
from server.projects import service as projects
from server.routing import TransactionalRoute
from server.runs import lifecycle
from server.sweeps import service
from server.sweeps.schemas import (
    SweepActionBody,
    SweepActionResult,
    SweepCreate,
    SweepCreated,
    SweepDetail,
    SweepOut,
)
from server.tokens.access import Caller, Reader, RunCreator, SweepReader, sweep_allowed
from server.tokens.roles import RUN_ACTIONS
from server.wake import wake

router = APIRouter(prefix="/api/v1/sweeps", tags=["sweeps"], route_class=TransactionalRoute)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=SweepCreated)
def create_sweep(
    body: SweepCreate,
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    caller: RunCreator,
    audit: AuditDep,
) -> SweepCreated:
    """Create a sweep: every combination of the grid (or each listed override) applied to the
    base config and validated before any run is made (422 naming the combination and the
    field), then all its runs in one transaction, each named after its overrides; each run's
    learner token is shown once, here. At most `sweeps.max_runs` runs (422 sweep_too_large)."""
    created, preparing = service.create_sweep(
        session, body, settings.sweeps.max_runs, settings.outbound_policy(), caller
    )
    sweep = created.sweep
    audit.record(session, caller.token, "sweep", sweep.id, detail={"runs": len(created.learners)})
    if preparing:
        session.commit()  # the job must see the runs
        wake(request.app.state, "datasets", "run_prep")
    return created


@router.get("", response_model=list[SweepOut])
def list_sweeps(
    session: SessionDep,
    caller: Reader,
    limit: Annotated[int, Query(ge=1, le=500, description="Page size.")] = 100,
    offset: Annotated[
        int, Query(ge=0, le=BIGINT_MAX, description="Sweeps to skip (newest first).")
    ] = 0,
    project: Annotated[
        str | None,
        Query(max_length=63, description="Only the sweeps of this project (name or id)."),
    ] = None,
) -> list[SweepOut]:
    """Sweeps, newest first, with their runs counted by status; of one project if given."""
    project_id = projects.listing_scope(session, caller, project)
    return service.list_sweeps(session, limit, offset, project_id)


@router.get("/{sweep_id}", response_model=SweepDetail)
def get_sweep(sweep_id: uuid.UUID, session: SessionDep, _caller: SweepReader) -> SweepDetail:
    """One sweep and its runs in order: overrides, status, current and best version, latest
    reward, latest eval accuracy, stale waste and spend of each."""
    return service.detail(session, service.get_sweep(session, sweep_id))


def _action(action: str):  # type: ignore[no-untyped-def]
    def handler(
        sweep_id: uuid.UUID,
        session: SessionDep,
        audit: AuditDep,
        body: SweepActionBody | None = None,
        caller: Caller = Depends(sweep_allowed(RUN_ACTIONS[action])),  # noqa: B008
    ) -> SweepActionResult:
        reason = body.reason if body is not None else None
        result = service.act(session, sweep_id, action, reason)
        detail: dict[str, object] = {"moved": result.moved, "refused": result.refused}
        if reason is not None:
            detail["reason"] = reason
        audit.record(session, caller.token, "sweep", sweep_id, detail=detail)
        return result

    handler.__name__ = f"{action}_sweep"
    return handler


for _name in lifecycle.ADMIN_ACTIONS:
    router.add_api_route(
        f"/{{sweep_id}}/{_name}",
        _action(_name),
        methods=["POST"],
        response_model=SweepActionResult,
        summary=f"{_name.capitalize()} every run of a sweep",
        description=f"{_name} applied to each run of the sweep by the run lifecycle (the "
        "same rule as POST /api/v1/runs/{run_id}/" + _name + "). A run whose status does not "
        "allow it is listed with `moved: false` and the refusal's code (invalid_transition), "
        "unchanged; the others move. 200 either way; 404 for an unknown sweep.",
    )
