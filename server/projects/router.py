"""Projects API (admin): create, list, read and rename projects (docs/guides/projects.md)."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, status

from server.audit.recorder import AuditDep
from server.projects import service
from server.projects.schemas import ProjectCreate, ProjectOut, ProjectRename
from server.request_deps import SessionDep
from server.routing import TransactionalRoute
from server.tokens.auth import AdminDep

router = APIRouter(prefix="/api/v1/projects", tags=["projects"], route_class=TransactionalRoute)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=ProjectOut)
def create_project(
    body: ProjectCreate, session: SessionDep, admin: AdminDep, audit: AuditDep
) -> ProjectOut:
    """Create a project; 409 project_name_taken when the name is in use."""
    project = service.create(session, body.name)
    audit.record(session, admin, "project", project.id, detail={"name": project.name})
    return project


@router.get("", response_model=list[ProjectOut])
def list_projects(session: SessionDep, _admin: AdminDep) -> list[ProjectOut]:
    """Every project, by name."""
    return service.list_projects(session)


@router.get("/{project_id}", response_model=ProjectOut)
def get_project(project_id: uuid.UUID, session: SessionDep, _admin: AdminDep) -> ProjectOut:
    """One project; 404 project_not_found."""
    return ProjectOut.model_validate(service.get(session, project_id))


@router.patch("/{project_id}", response_model=ProjectOut)
def rename_project(
    project_id: uuid.UUID,
    body: ProjectRename,
    session: SessionDep,
    admin: AdminDep,
    audit: AuditDep,
) -> ProjectOut:
    """Rename a project (its runs, sweeps, datasets, workers and tokens keep it); 409
    project_name_taken, 404 project_not_found."""
    project = service.rename(session, project_id, body.name)
    audit.record(session, admin, "project", project.id, detail={"name": project.name})
    return project
