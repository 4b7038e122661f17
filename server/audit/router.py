"""GET /api/v1/audit (a filtered page) and GET /api/v1/audit.csv (the same entries, streamed).
Admins only: the guard is added where the app includes this router (server/app.py), as the
audit log sits below the tokens feature."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse

from protocol.schemas import BIGINT_MAX
from server.audit import service
from server.audit.repository import Filters
from server.audit.schemas import AuditPage, FilterTime, Outcome
from server.request_deps import SessionDep
from server.routing import TransactionalRoute

router = APIRouter(prefix="/api/v1", tags=["audit"], route_class=TransactionalRoute)

TEXT = r"^[^\x00]*$"


def filters(
    action: Annotated[
        str | None, Query(max_length=64, pattern=TEXT, description="Only this action.")
    ] = None,
    project_id: Annotated[
        uuid.UUID | None, Query(description="Only entries of this project.")
    ] = None,
    token_id: Annotated[uuid.UUID | None, Query(description="Only this token's calls.")] = None,
    object_type: Annotated[
        str | None, Query(max_length=32, pattern=TEXT, description="Only this kind of object.")
    ] = None,
    object_id: Annotated[
        str | None, Query(max_length=64, pattern=TEXT, description="Only this object.")
    ] = None,
    outcome: Annotated[Outcome | None, Query(description="Only this outcome.")] = None,
    since: Annotated[
        FilterTime | None, Query(description="Entries at or after this time (no zone: UTC).")
    ] = None,
    until: Annotated[
        FilterTime | None, Query(description="Entries before this time (no zone: UTC).")
    ] = None,
) -> Filters:
    return Filters(action, project_id, token_id, object_type, object_id, outcome, since, until)


FiltersDep = Annotated[Filters, Depends(filters)]


@router.get("/audit", response_model=AuditPage)
def list_audit(
    session: SessionDep,
    where: FiltersDep,
    limit: Annotated[int, Query(ge=1, le=500, description="Page size.")] = 100,
    cursor: Annotated[
        int | None,
        Query(ge=1, le=BIGINT_MAX, description="The previous page's `next_cursor`."),
    ] = None,
) -> AuditPage:
    """The audit log, newest first, filtered; page on with `next_cursor`."""
    return service.page(session, where, limit, cursor)


@router.get("/audit.csv", response_class=StreamingResponse)
def export_audit(request: Request, where: FiltersDep) -> StreamingResponse:
    """The same entries as GET /api/v1/audit, all of them, as CSV (streamed)."""
    lines = service.csv_lines(request.app.state.sessionmaker, where)
    return StreamingResponse(
        lines,
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": 'attachment; filename="audit.csv"'},
    )
