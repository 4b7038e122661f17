"""Writing the audit log (invariant 30; docs/architecture/security.md, "The audit log").

A state-changing call records its entry with `Audit.record` on the request's own session, so
the entry commits with the change and rolls back with it: a change without its entry, or an
entry without its change, cannot be committed. A refused call (401, 403) has no change to ride
on: `record_refusal` writes it in a short transaction of its own, at most
`audit.refusals_per_minute` a minute per (source address, token prefix); the rest of that
minute add to one `suppressed` entry's count."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Annotated, Any

from fastapi import Depends, Request
from sqlalchemy.orm import Session, sessionmaker

from server.audit import actions, repository
from server.audit.source import Network, networks, source_address
from server.config import Settings
from server.db import transaction
from server.models import AuditEntry, Dataset, PoolLearner, Run, Sweep, Token, Worker

log = logging.getLogger("asyncgrpo.audit")

# The table of each object type whose rows carry their project (a project is its own).
_PROJECT_OF: dict[str, Any] = {
    "run": Run,
    "sweep": Sweep,
    "dataset": Dataset,
    "worker": Worker,
    "learner": PoolLearner,
    "token": Token,
}
MAX_NAME = 200
MAX_OBJECT_ID = 64


@lru_cache(maxsize=8)
def _trusted(cidrs: tuple[str, ...]) -> tuple[Network, ...]:
    return networks(cidrs)


def source_of(request: Request) -> str | None:
    settings: Settings = request.app.state.settings
    return source_address(request, _trusted(tuple(settings.audit.trusted_proxies)))


def route_action(request: Request) -> str:
    """The action name of the request's route (actions.AUDITED); a route in neither table is
    named by its method and path."""
    route = request.scope.get("route")
    path = str(getattr(route, "path_format", request.url.path))
    name = actions.action_of(request.method, path, dict(request.path_params))
    return name if name is not None else f"{request.method} {path}"[:64]


def _caller(session: Session, token: Token | uuid.UUID | None) -> dict[str, Any]:
    if isinstance(token, uuid.UUID):
        token = session.get(Token, token)
    if token is None:
        return {}
    return {
        "token_id": token.id,
        "token_name": (token.name or "")[:MAX_NAME] or None,
        "token_prefix": token.prefix,
        "role": token.role or token.kind,  # a project token's role, else its kind
    }


def _project(session: Session, object_type: str, object_id: Any) -> uuid.UUID | None:
    if object_type == "project":
        return object_id if isinstance(object_id, uuid.UUID) else None
    model = _PROJECT_OF.get(object_type)
    row = None if model is None or object_id is None else session.get(model, object_id)
    return getattr(row, "project_id", None)


@dataclass(frozen=True)
class Audit:
    """The audit of one request: its action (from its route) and source address."""

    action: str
    source: str | None

    def record(
        self,
        session: Session,
        token: Token | uuid.UUID | None,
        object_type: str,
        object_id: Any = None,
        *,
        project_id: uuid.UUID | None = None,
        detail: dict[str, Any] | None = None,
    ) -> AuditEntry:
        """One `ok` entry in the session's transaction (flushed, committed with the change).
        `project_id` defaults to the object's project."""
        return repository.insert(
            session,
            **_caller(session, token),
            project_id=project_id or _project(session, object_type, object_id),
            action=self.action,
            object_type=object_type,
            object_id=None if object_id is None else str(object_id)[:MAX_OBJECT_ID],
            source=self.source,
            outcome="ok",
            count=1,
            detail=detail,
        )


def audit_of(request: Request) -> Audit:
    return Audit(route_action(request), source_of(request))


AuditDep = Annotated[Audit, Depends(audit_of)]

# The source of a change made by a command run where the database is, not by an API call
# (recorded with no token, the command in `detail`).
ON_THE_SERVER = "server"


def on_the_server(action: str) -> Audit:
    """The audit of a change made on the server's host (`asyncgrpo admin-token create`, the
    first start's admin token): the action named as the API's is (actions.AUDITED)."""
    return Audit(action, ON_THE_SERVER)


# -- refusals ------------------------------------------------------------------------------------

Identify = Callable[[Session, str], Token | None]
OUTCOMES = {401: "unauthorized", 403: "forbidden"}


@dataclass(frozen=True)
class Refusal:
    """A refused call, as the error handler saw it."""

    status: int
    code: str
    action: str
    source: str | None
    bearer: str | None = field(repr=False)  # the presented token, to identify it (never stored)


def refusal_of(request: Request, status: int, code: str) -> Refusal:
    header = request.headers.get("authorization", "")
    scheme, _, bearer = header.partition(" ")
    return Refusal(
        status=status,
        code=code,
        action=route_action(request),
        source=source_of(request),
        bearer=bearer.strip() if scheme.lower() == "bearer" and bearer.strip() else None,
    )


def record_refusal(
    factory: sessionmaker[Session], refusal: Refusal, identify: Identify, per_minute: int
) -> None:
    """Its own transaction; a failure to record is logged, never turned into another error."""
    try:
        with transaction(factory) as session:
            record_refusal_in(session, refusal, identify, per_minute)
    except Exception:  # noqa: BLE001 - the refusal's answer must not depend on the log
        log.exception("audit: could not record a refused call (%s)", refusal.action)


def record_refusal_in(
    session: Session, refusal: Refusal, identify: Identify, per_minute: int
) -> None:
    token = identify(session, refusal.bearer) if refusal.bearer else None
    caller = _caller(session, token)
    prefix = caller.get("token_prefix")
    if repository.refusals_in_window(session, refusal.source, prefix) >= per_minute:
        if not repository.count_suppressed(session, refusal.source, prefix):
            _insert_refusal(session, refusal, caller, repository.SUPPRESSED)
        return
    _insert_refusal(session, refusal, caller, OUTCOMES.get(refusal.status, "forbidden"))


def _insert_refusal(
    session: Session, refusal: Refusal, caller: dict[str, Any], outcome: str
) -> None:
    repository.insert(
        session,
        **caller,
        action=refusal.action,
        source=refusal.source,
        outcome=outcome,
        count=1,
        detail={"status": refusal.status, "code": refusal.code},
    )
