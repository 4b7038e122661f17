from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, status

from server.audit.recorder import AuditDep
from server.request_deps import SessionDep
from server.routing import TransactionalRoute
from server.tokens import service
from server.tokens.auth import AdminDep
from server.tokens.schemas import (
    RegistrationTokenCreate,
    RegistrationTokenCreated,
    SessionsEnded,
    TokenOut,
)

router = APIRouter(prefix="/api/v1", tags=["tokens"], route_class=TransactionalRoute)


@router.post(
    "/registration-tokens",
    status_code=status.HTTP_201_CREATED,
    response_model=RegistrationTokenCreated,
)
def create_registration_token(
    body: RegistrationTokenCreate, session: SessionDep, admin: AdminDep, audit: AuditDep
) -> RegistrationTokenCreated:
    """Create a registration token (name, lifetime, uses); the token is answered once."""
    created = service.create_registration_token(session, body)
    audit.record(session, admin, "token", created.id, detail={"kind": "registration"})
    return created


ForceQuery = Annotated[
    bool,
    Query(
        description="Revoke even the last live admin token (locks the API until a new one "
        "is minted with `asyncgrpo admin-token create`)."
    ),
]


@router.get("/registration-tokens", response_model=list[TokenOut])
def list_registration_tokens(session: SessionDep, _admin: AdminDep) -> list[TokenOut]:
    """Registration tokens (prefix, name, expiry, uses, revoked or live), never the token."""
    return [TokenOut.model_validate(t) for t in service.list_tokens(session, "registration")]


@router.post("/registration-tokens/{token_id}/revoke", response_model=TokenOut)
def revoke_registration_token(
    token_id: uuid.UUID, session: SessionDep, admin: AdminDep, audit: AuditDep
) -> TokenOut:
    """Revoke a registration token: no more workers register with it."""
    revoked = service.revoke(session, "registration", token_id)
    audit.record(session, admin, "token", token_id, detail={"kind": "registration"})
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
