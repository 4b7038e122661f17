from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Depends, Query, status

from server.audit.recorder import AuditDep
from server.request_deps import SessionDep
from server.routing import TransactionalRoute
from server.tokens import service
from server.tokens.access import Caller, allowed
from server.tokens.auth import AdminDep
from server.tokens.roles import Action
from server.tokens.schemas import (
    RegistrationTokenCreate,
    RegistrationTokenCreated,
    SessionsEnded,
    TokenOut,
)

router = APIRouter(prefix="/api/v1", tags=["tokens"], route_class=TransactionalRoute)

# An admin, or a project's owner or member for that project's registration tokens
# (server/tokens/roles.py).
RegistrationTokenManager = Annotated[Caller, Depends(allowed(Action.manage_registration_tokens))]


@router.post(
    "/registration-tokens",
    status_code=status.HTTP_201_CREATED,
    response_model=RegistrationTokenCreated,
)
def create_registration_token(
    body: RegistrationTokenCreate,
    session: SessionDep,
    caller: RegistrationTokenManager,
    audit: AuditDep,
) -> RegistrationTokenCreated:
    """Create a registration token (name, lifetime, uses, project); the token is answered once.
    With a project (name or id; 422 unknown_project) its workers and pool learners serve only
    that project's runs; without one it is shared: they serve every project (an admin's call;
    a project token's tokens are of its own project)."""
    created = service.create_registration_token(session, body, caller.project_id)
    audit.record(session, caller.token, "token", created.id, detail={"kind": "registration"})
    return created


ForceQuery = Annotated[
    bool,
    Query(
        description="Revoke even the last live admin token (locks the API until a new one "
        "is minted with `asyncgrpo admin-token create`)."
    ),
]


@router.get("/registration-tokens", response_model=list[TokenOut])
def list_registration_tokens(
    session: SessionDep, caller: RegistrationTokenManager
) -> list[TokenOut]:
    """Registration tokens (prefix, name, expiry, uses, project, revoked or live), never the
    token; a project token's: its project's only."""
    found = service.list_tokens(session, "registration", caller.project_id)
    return [TokenOut.model_validate(t) for t in found]


@router.post("/registration-tokens/{token_id}/revoke", response_model=TokenOut)
def revoke_registration_token(
    token_id: uuid.UUID, session: SessionDep, caller: RegistrationTokenManager, audit: AuditDep
) -> TokenOut:
    """Revoke a registration token: no more workers register with it (a project token: one
    of its project's; any other is 404 token_not_found)."""
    revoked = service.revoke(session, "registration", token_id, reach=caller.project_id)
    audit.record(session, caller.token, "token", token_id, detail={"kind": "registration"})
    return TokenOut.model_validate(revoked)


@router.get("/admin-tokens", response_model=list[TokenOut])
def list_admin_tokens(session: SessionDep, _admin: AdminDep) -> list[TokenOut]:
    """Admin tokens (prefix, name, expiry, last use, revoked or live), never the token."""
    return [TokenOut.model_validate(t) for t in service.list_tokens(session, "admin")]


@router.post("/admin-tokens/{token_id}/revoke", response_model=TokenOut)
def revoke_admin_token(
    token_id: uuid.UUID,
    session: SessionDep,
    admin: AdminDep,
    audit: AuditDep,
    force: ForceQuery = False,
) -> TokenOut:
    """Revoke an admin token and end its dashboard sessions; 409 for the last live one unless
    force=true."""
    revoked = service.revoke(session, "admin", token_id, force=force)
    audit.record(session, admin, "token", token_id, detail={"kind": "admin", "force": force})
    return TokenOut.model_validate(revoked)


@router.post("/dashboard-sessions/revoke-all", response_model=SessionsEnded)
def log_out_everywhere(session: SessionDep, admin: AdminDep, audit: AuditDep) -> SessionsEnded:
    """End every dashboard session (log out everywhere)."""
    ended = service.end_all_dashboard_sessions(session)
    audit.record(session, admin, "dashboard_session", None, detail={"ended": ended})
    return SessionsEnded(ended=ended)
