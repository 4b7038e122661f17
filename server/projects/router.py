"""Projects API (docs/guides/projects.md): admins create, rename and list every project; a
project token reads its own. A project's API tokens: its owner (or an admin) mints, lists and
revokes them (server/tokens/roles.py)."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, status

from server.audit.recorder import AuditDep
from server.projects import service
from server.projects.schemas import ProjectCreate, ProjectListed, ProjectOut, ProjectRename
from server.request_deps import SessionDep
from server.routing import TransactionalRoute
from server.tokens import service as tokens
from server.tokens.access import ProjectReader, ProjectTokenManager, Reader
from server.tokens.auth import AdminDep
from server.tokens.schemas import ProjectTokenCreate, ProjectTokenCreated, TokenOut

router = APIRouter(prefix="/api/v1/projects", tags=["projects"], route_class=TransactionalRoute)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=ProjectOut)
def create_project(
    body: ProjectCreate, session: SessionDep, admin: AdminDep, audit: AuditDep
) -> ProjectOut:
    """Create a project; 409 project_name_taken when the name is in use."""
    project = service.create(session, body.name)
    audit.record(session, admin, "project", project.id, detail={"name": project.name})
    return project


@router.get("", response_model=list[ProjectListed])
def list_projects(session: SessionDep, caller: Reader) -> list[ProjectListed]:
    """Every project, by name, with its run count (a project token: its own)."""
    return service.list_projects(session, caller)


@router.get("/{project_id}", response_model=ProjectOut)
def get_project(project_id: uuid.UUID, session: SessionDep, _caller: ProjectReader) -> ProjectOut:
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


@router.post(
    "/{project_id}/tokens", status_code=status.HTTP_201_CREATED, response_model=ProjectTokenCreated
)
def create_project_token(
    project_id: uuid.UUID,
    body: ProjectTokenCreate,
    session: SessionDep,
    caller: ProjectTokenManager,
    audit: AuditDep,
) -> ProjectTokenCreated:
    """Mint an API token of the project with one role (owner, member, ci, viewer); the token
    is in this answer only. An admin's or the project owner's call."""
    service.get(session, project_id)
    made = tokens.create_project_token(session, project_id, body)
    audit.record(
        session, caller.token, "token", made.id, detail={"kind": "project", "role": made.role}
    )
    return made


@router.get("/{project_id}/tokens", response_model=list[TokenOut])
def list_project_tokens(
    project_id: uuid.UUID, session: SessionDep, _caller: ProjectTokenManager
) -> list[TokenOut]:
    """The project's API tokens, newest first (never the tokens themselves)."""
    service.get(session, project_id)
    return [TokenOut.model_validate(t) for t in tokens.list_project_tokens(session, project_id)]


@router.post("/{project_id}/tokens/{token_id}/revoke", response_model=TokenOut)
def revoke_project_token(
    project_id: uuid.UUID,
    token_id: uuid.UUID,
    session: SessionDep,
    caller: ProjectTokenManager,
    audit: AuditDep,
) -> TokenOut:
    """Revoke one of the project's tokens (idempotent); its dashboard sessions end with it.
    404 token_not_found for a token of another project."""
    revoked = tokens.revoke_project_token(session, project_id, token_id)
    audit.record(session, caller.token, "token", token_id, detail={"kind": "project"})
    return TokenOut.model_validate(revoked)
