"""Project rules (docs/guides/projects.md): names are unique lowercase slugs
(server/projects/schemas.py PROJECT_NAME_PATTERN); a run, sweep or dataset names its project by
name or id, the `default` project when it names none (`resolve`, the one home of that lookup);
a worker, pool learner or registration token with no project is the shared fleet."""

from __future__ import annotations

import uuid

from sqlalchemy.orm import Session

from protocol.error_codes import ErrorCode
from server.errors import Conflict, NotFound, Unprocessable
from server.models import Project
from server.models.project import DEFAULT_PROJECT_ID
from server.projects import repository
from server.projects.schemas import ProjectListed, ProjectOut
from server.tokens.access import Caller


def create(session: Session, name: str) -> ProjectOut:
    project = repository.insert(session, name)
    if project is None:
        raise _taken(name)
    return ProjectOut.model_validate(project)


def list_projects(session: Session, caller: Caller | None = None) -> list[ProjectListed]:
    """Every project, by name, with its run count; a project token's own only (None: an
    admin's, as the dashboard's login is)."""
    counts = repository.run_counts(session)
    return [
        ProjectListed(**ProjectOut.model_validate(p).model_dump(), runs=counts.get(p.id, 0))
        for p in repository.list_all(session)
        if caller is None or caller.sees(p.id)
    ]


def get(session: Session, project_id: uuid.UUID) -> Project:
    project = repository.get(session, project_id)
    if project is None:
        raise NotFound(f"project {project_id} not found", code=ErrorCode.project_not_found)
    return project


def by_name(session: Session, name: str) -> Project | None:
    """The project of this name, or None (a filter by name that matches nothing)."""
    if "\x00" in name:  # no name has it, and Postgres text cannot hold U+0000
        return None
    return repository.by_name(session, name)


def rename(session: Session, project_id: uuid.UUID, name: str) -> ProjectOut:
    project = get(session, project_id)
    if project.name != name and not repository.rename(session, project, name):
        raise _taken(name)
    return ProjectOut.model_validate(project)


def resolve(session: Session, ref: str | uuid.UUID | None, field: str = "project") -> uuid.UUID:
    """The id of the project `ref` names (its name or its id); the default project for None.
    An unknown one is a 422 unknown_project naming `field`."""
    if ref is None:
        return DEFAULT_PROJECT_ID
    project = _find(session, ref)
    if project is None:
        raise _unknown(ref, field)
    return project.id


def _find(session: Session, ref: str | uuid.UUID) -> Project | None:
    if isinstance(ref, uuid.UUID):
        return repository.get(session, ref)
    project = by_name(session, ref)
    if project is None and _is_uuid(ref):
        project = repository.get(session, uuid.UUID(ref))
    return project


def resolve_within(
    session: Session, reach: uuid.UUID | None, ref: str | uuid.UUID | None, field: str = "project"
) -> uuid.UUID:
    """`resolve` within a reach (a project token's project; None: every project): the reach
    itself when `ref` is None; a project out of it is as unknown as one that does not exist
    (422), so its existence is never confirmed."""
    if ref is None and reach is not None:
        return reach
    project_id = resolve(session, ref, field)
    if reach is not None and project_id != reach:
        raise _unknown(ref, field)
    return project_id


def resolve_for(
    session: Session, caller: Caller, ref: str | uuid.UUID | None, field: str = "project"
) -> uuid.UUID:
    """`resolve_within` the caller's reach."""
    return resolve_within(session, caller.project_id, ref, field)


def listing_scope(session: Session, caller: Caller, ref: str | None) -> uuid.UUID | None:
    """The project a listing covers: the one named (in reach), else a project token's own,
    else None (an admin's listing of every project)."""
    return caller.project_id if ref is None else resolve_for(session, caller, ref)


def _unknown(ref: object, field: str) -> Unprocessable:
    return Unprocessable(
        f"project {str(ref)[:80]} not found", code=ErrorCode.unknown_project, field=field
    )


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def _taken(name: str) -> Conflict:
    return Conflict(
        f"a project named {name!r} exists", code=ErrorCode.project_name_taken, field="name"
    )
