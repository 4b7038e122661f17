from __future__ import annotations

from datetime import timedelta

from fastapi import APIRouter, status

from server.deps import AdminDep, SessionDep
from server.routing import TransactionalRoute
from server.tokens import service
from server.tokens.schemas import RegistrationTokenCreate, RegistrationTokenCreated

router = APIRouter(prefix="/api/v1", tags=["tokens"], route_class=TransactionalRoute)


@router.post(
    "/registration-tokens",
    status_code=status.HTTP_201_CREATED,
    response_model=RegistrationTokenCreated,
)
def create_registration_token(
    body: RegistrationTokenCreate, session: SessionDep, _admin: AdminDep
) -> RegistrationTokenCreated:
    minted = service.mint(
        session,
        "registration",
        name=body.name,
        ttl=timedelta(hours=body.ttl_hours),
        max_uses=body.max_uses,
    )
    t = minted.token
    return RegistrationTokenCreated(
        id=t.id,
        token=minted.plaintext,
        prefix=t.prefix,
        expires_at=t.expires_at,
        max_uses=t.max_uses,
    )
