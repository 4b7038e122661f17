from __future__ import annotations

from fastapi import APIRouter

from server.db import ping
from server.deps import SessionDep
from server.routing import TransactionalRoute

router = APIRouter(tags=["health"], route_class=TransactionalRoute)


@router.get("/healthz")
def healthz(session: SessionDep) -> dict[str, str]:
    ping(session)
    return {"status": "ok"}
