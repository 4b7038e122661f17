"""The dashboard's Audit page (docs/guides/audit.md): the audit log with the API's filters, an
older-entries link (the API's cursor) and the CSV export, for a logged-in admin."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, StreamingResponse

from server.audit import service as audit
from server.audit.repository import Filters
from server.audit.schemas import as_utc
from server.dashboard.web import LoginDep, render
from server.deps import SessionDep
from server.routing import TransactionalRoute

router = APIRouter(include_in_schema=False, route_class=TransactionalRoute)
PAGE = 50
TEXT_FIELDS = {"action": 64, "object_type": 32, "object_id": 64}
OUTCOMES = ("ok", "unauthorized", "forbidden", "suppressed")


def _uuid(value: str, field: str, errors: list[str]) -> uuid.UUID | None:
    try:
        return uuid.UUID(value) if value else None
    except ValueError:
        errors.append(f"{field}: not an id")
        return None


def _time(value: str, field: str, errors: list[str]) -> datetime | None:
    try:
        return as_utc(datetime.fromisoformat(value)) if value else None
    except ValueError:
        errors.append(f"{field}: not a time (ISO 8601, e.g. 2026-12-08T09:00)")
        return None


def parse(params: dict[str, str]) -> tuple[Filters, list[str]]:
    """The form's filters; a blank field is no filter, a bad one is named in the errors."""
    errors: list[str] = []
    text = {
        k: params.get(k, "").replace("\x00", "").strip()[:n] or None for k, n in TEXT_FIELDS.items()
    }
    outcome = params.get("outcome") or None
    if outcome is not None and outcome not in OUTCOMES:
        errors.append("outcome: one of " + ", ".join(OUTCOMES))
        outcome = None
    filters = Filters(
        action=text["action"],
        project_id=_uuid(params.get("project_id", "").strip(), "project_id", errors),
        token_id=_uuid(params.get("token_id", "").strip(), "token_id", errors),
        object_type=text["object_type"],
        object_id=text["object_id"],
        outcome=outcome,
        since=_time(params.get("since", "").strip(), "since", errors),
        until=_time(params.get("until", "").strip(), "until", errors),
    )
    return filters, errors


def _cursor(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() and len(value) < 19 else None


def _context(request: Request, session: SessionDep) -> dict[str, Any]:
    params = dict(request.query_params)
    filters, errors = parse(params)
    page = audit.page(session, filters, PAGE, _cursor(params.get("cursor")))
    shown = {k: v for k, v in params.items() if v and k != "cursor"}
    older = None
    if page.next_cursor is not None:
        older = "/audit?" + urlencode({**shown, "cursor": page.next_cursor})
    return {
        "entries": page.entries,
        "errors": errors,
        "values": shown,
        "outcomes": OUTCOMES,
        "older": older,
        "csv_url": "/audit.csv" + ("?" + urlencode(shown) if shown else ""),
    }


@router.get("/audit", response_class=HTMLResponse)
def audit_page(request: Request, session: SessionDep, _user: LoginDep) -> HTMLResponse:
    return render(request, "pages/audit.html", page="audit", **_context(request, session))


@router.get("/audit/table", response_class=HTMLResponse)
def audit_table(request: Request, session: SessionDep, _user: LoginDep) -> HTMLResponse:
    return render(request, "components/_audit_table.html", **_context(request, session))


@router.get("/audit.csv", response_class=StreamingResponse)
def audit_csv(request: Request, _user: LoginDep) -> StreamingResponse:
    filters, _errors = parse(dict(request.query_params))
    return StreamingResponse(
        audit.csv_lines(request.app.state.sessionmaker, filters),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": 'attachment; filename="audit.csv"'},
    )
