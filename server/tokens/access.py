"""Who may do what on which project's objects, as request dependencies (invariant 29,
docs/architecture/security.md "Project tokens"; the role × action table: roles.py).

The order of the checks is the rule: no live token 401 (`authenticated_caller`); an object of
another project 404, as if it did not exist (its existence is never confirmed); a role without
the right 403 (`role_forbidden`); bad input 422 after all of them (FastAPI validates the body
once the dependencies have passed). An admin token passes every check."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends
from sqlalchemy import select
from sqlalchemy.orm import Session

from protocol.error_codes import ErrorCode
from server.errors import Forbidden, NotFound
from server.models import Dataset, Run, Sweep, Token
from server.request_deps import AdminCredentials, ProjectCredentials, SessionDep, released
from server.tokens import service as tokens
from server.tokens.auth import bearer_token
from server.tokens.roles import Action, Role, allows, own_runs_only

CALLER_KINDS = ("admin", "project")


@dataclass(frozen=True)
class Caller:
    """The admin or project token behind a request."""

    token: Token

    @property
    def role(self) -> Role | None:
        """The project token's role; None for an admin token (every right)."""
        return None if self.token.kind == "admin" else Role(self.token.role or Role.viewer)

    @property
    def project_id(self) -> uuid.UUID | None:
        """The one project a project token acts in; None for an admin token (every one)."""
        return None if self.token.kind == "admin" else self.token.project_id

    def sees(self, project_id: uuid.UUID | None) -> bool:
        return self.project_id is None or self.project_id == project_id

    def require(self, action: Action) -> None:
        if self.role is not None and not allows(self.role, action):
            raise Forbidden(
                f"a {self.role} token cannot {action.replace('_', ' ')}",
                code=ErrorCode.role_forbidden,
            )


def authenticated_caller(
    session: SessionDep, admin: AdminCredentials, project: ProjectCredentials
) -> Caller:
    """A live admin or project token (401 without one; 403 for a token of another kind)."""
    plaintext = bearer_token(admin or project)
    return Caller(released(session, tokens.authenticate(session, plaintext, CALLER_KINDS)))


CallerDep = Annotated[Caller, Depends(authenticated_caller)]


def allowed(action: Action) -> Callable[..., Caller]:
    """A dependency: the caller, if its role allows `action` (no object of a project named)."""

    def dependency(caller: CallerDep) -> Caller:
        caller.require(action)
        return caller

    dependency.__name__ = f"may_{action}"
    return dependency


def _in_reach(caller: Caller, project_id: uuid.UUID | None, missing: NotFound) -> None:
    """404 for another project's object (or none): the same answer as for no object."""
    if project_id is None or not caller.sees(project_id):
        raise missing


def _reach_and_right(
    model: Any, object_id: uuid.UUID, session: Session, caller: Caller, action: Action
) -> None:
    """The object in the caller's reach (404 otherwise, the answer for no object), the role's
    right (403), and for a role that acts only on what its token created, that (403)."""
    created_by = getattr(model, "created_by_token_id", None)
    columns = [model.project_id] if created_by is None else [model.project_id, created_by]
    row = released(session, session.execute(select(*columns).where(model.id == object_id)).first())
    _in_reach(caller, None if row is None else row[0], _NOT_FOUND[model](object_id))
    caller.require(action)
    assert row is not None and caller.role is not None
    if own_runs_only(caller.role, action) and (created_by is None or row[1] != caller.token.id):
        raise Forbidden(
            f"a {caller.role} token may {action.replace('_', ' ')} only what it created",
            code=ErrorCode.role_forbidden,
        )


_NOT_FOUND: dict[Any, Callable[[uuid.UUID], NotFound]] = {
    Run: lambda i: NotFound(f"run {i} not found", code=ErrorCode.run_not_found),
    Sweep: lambda i: NotFound(f"sweep {i} not found", code=ErrorCode.sweep_not_found),
    Dataset: lambda i: NotFound(f"dataset {i} not found", code=ErrorCode.dataset_not_found),
}


def run_allowed(action: Action) -> Callable[..., Caller]:
    """A dependency of routes under /runs/{run_id} (_reach_and_right); an admin passes, and
    the route's own lookup answers for the run."""

    def dependency(run_id: uuid.UUID, session: SessionDep, caller: CallerDep) -> Caller:
        if caller.project_id is not None:
            _reach_and_right(Run, run_id, session, caller, action)
        return caller

    dependency.__name__ = f"may_{action}_this_run"
    return dependency


def sweep_allowed(action: Action) -> Callable[..., Caller]:
    def dependency(sweep_id: uuid.UUID, session: SessionDep, caller: CallerDep) -> Caller:
        if caller.project_id is not None:
            _reach_and_right(Sweep, sweep_id, session, caller, action)
        return caller

    dependency.__name__ = f"may_{action}_this_sweep"
    return dependency


def dataset_allowed(action: Action) -> Callable[..., Caller]:
    def dependency(dataset_id: uuid.UUID, session: SessionDep, caller: CallerDep) -> Caller:
        if caller.project_id is not None:
            _reach_and_right(Dataset, dataset_id, session, caller, action)
        return caller

    dependency.__name__ = f"may_{action}_this_dataset"
    return dependency


def project_allowed(action: Action) -> Callable[..., Caller]:
    """Routes under /projects/{project_id}: a project token reaches its own project only."""

    def dependency(project_id: uuid.UUID, caller: CallerDep) -> Caller:
        missing = NotFound(f"project {project_id} not found", code=ErrorCode.project_not_found)
        _in_reach(caller, project_id, missing)
        caller.require(action)
        return caller

    dependency.__name__ = f"may_{action}_this_project"
    return dependency


Reader = Annotated[Caller, Depends(allowed(Action.read))]
RunReader = Annotated[Caller, Depends(run_allowed(Action.read))]
RunCreator = Annotated[Caller, Depends(allowed(Action.create_run))]
DatasetUploader = Annotated[Caller, Depends(allowed(Action.upload_dataset))]
SweepReader = Annotated[Caller, Depends(sweep_allowed(Action.read))]
DatasetReader = Annotated[Caller, Depends(dataset_allowed(Action.read))]
DatasetDeleter = Annotated[Caller, Depends(dataset_allowed(Action.delete_dataset))]
ProjectReader = Annotated[Caller, Depends(project_allowed(Action.read))]
ProjectTokenManager = Annotated[Caller, Depends(project_allowed(Action.manage_tokens))]
