"""The dashboard's Projects page (docs/guides/dashboard.md): every project with its run count,
a create form and a rename form per project, through the projects service (its rules: a
unique lowercase slug, server/projects/). A refused name shows the reason on the page."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError

from server.audit.recorder import AuditDep
from server.dashboard.web import CsrfDep, LoginDep, render
from server.deps import SessionDep
from server.errors import AppError
from server.projects import service as projects
from server.projects.schemas import ProjectCreate
from server.routing import TransactionalRoute

router = APIRouter(include_in_schema=False, route_class=TransactionalRoute)
# Longer than any valid name, so that a too-long one is refused by the name rule, on the page.
NameForm = Annotated[str, Form(max_length=200)]


def _page(
    request: Request, session: SessionDep, flash: str | None = None, status_code: int = 200
) -> HTMLResponse:
    return render(
        request,
        "pages/projects.html",
        status_code,
        page="projects",
        flash=flash,
        projects=projects.list_projects(session),
    )


def _name_refusal(name: str) -> str | None:
    """Why `name` cannot be a project's name (the API's rule), or None."""
    try:
        ProjectCreate(name=name)
    except ValidationError:
        return (
            f"{name!r} is not a project name: a lowercase slug of 1-63 characters "
            "(a-z, 0-9 and -, starting with a letter or digit)"
        )
    return None


@router.get("/projects", response_class=HTMLResponse)
def projects_page(request: Request, session: SessionDep, _user: LoginDep) -> HTMLResponse:
    return _page(request, session)


@router.post("/projects", response_class=HTMLResponse)
def create_project(
    request: Request, session: SessionDep, user: CsrfDep, audit: AuditDep, name: NameForm = ""
) -> Response:
    refusal = _name_refusal(name.strip())
    if refusal is not None:
        return _page(request, session, refusal, 422)
    try:
        made = projects.create(session, name.strip())
    except AppError as exc:
        return _page(request, session, exc.message, exc.status_code)
    audit.record(session, user.token_id, "project", made.id, detail={"name": made.name})
    return RedirectResponse("/projects", status_code=303)


@router.post("/projects/{project_id}/rename", response_class=HTMLResponse)
def rename_project(
    request: Request,
    project_id: uuid.UUID,
    session: SessionDep,
    user: CsrfDep,
    audit: AuditDep,
    name: NameForm = "",
) -> Response:
    refusal = _name_refusal(name.strip())
    if refusal is not None:
        return _page(request, session, refusal, 422)
    try:
        renamed = projects.rename(session, project_id, name.strip())
    except AppError as exc:
        return _page(request, session, exc.message, exc.status_code)
    audit.record(session, user.token_id, "project", renamed.id, detail={"name": renamed.name})
    return RedirectResponse("/projects", status_code=303)
