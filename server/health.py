from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field
from sqlalchemy.exc import SQLAlchemyError

from server.db import ping, transaction
from server.deps import SessionDep
from server.errors import AppError
from server.routing import TransactionalRoute

log = logging.getLogger(__name__)
router = APIRouter(tags=["health"], route_class=TransactionalRoute)


class Readiness(BaseModel):
    status: str = Field(description="`ready`.")
    database: str = Field(
        description="`ok`, or `unavailable (<error class>; …)`: the reason is in the server log "
        "(this route takes no token, so it never shows the database's address or user)."
    )
    bucket: str = Field(description="`ok`, or why the bucket cannot be used (the last check).")


class NotReadyBody(BaseModel):
    detail: str = Field(description="`not ready: ` and the parts that are not, e.g. `bucket`.")
    code: str = Field(description="`not_ready`.")
    status: str = Field(description="`not ready`.")
    database: str = Field(
        description="`ok`, or `unavailable (<error class>; …)`: the reason is in the server log "
        "(this route takes no token, so it never shows the database's address or user)."
    )
    bucket: str = Field(description="`ok`, or why the bucket cannot be used (the last check).")


class NotReady(AppError):
    status_code = 503


@router.get("/healthz")
def healthz(session: SessionDep) -> dict[str, str]:
    """Liveness: 200 when the server answers and its database answers a query."""
    ping(session)
    return {"status": "ok"}


@router.get(
    "/readyz",
    responses={503: {"model": NotReadyBody, "description": "The database or the bucket is not "
                     "ready; `database` and `bucket` say which and why."}},
)  # fmt: skip
def readyz(request: Request) -> Readiness:
    """Readiness (a load balancer's or Kubernetes' readinessProbe): the database answers and
    the bucket exists, is reachable and is recorded as the database's. The bucket part is the
    last check of this process (every `bucket_check_interval_s`). /healthz is liveness only."""
    database = _database_state(request)
    bucket = request.app.state.bucket_watch.state
    if database == "ok" and bucket.ready:
        return Readiness(status="ready", database="ok", bucket="ok")
    checks = {"database": database == "ok", "bucket": bucket.ready}
    failing = [name for name, ok in checks.items() if not ok]
    raise NotReady(
        f"not ready: {' and '.join(failing)}",
        code="not_ready",
        status="not ready",
        database=database,
        bucket=bucket.reason,
    )


def _database_state(request: Request) -> str:
    try:
        with transaction(request.app.state.sessionmaker) as session:
            ping(session)
    except SQLAlchemyError as exc:
        # /readyz takes no token: the driver's message (host, port, user) goes to the log only
        log.warning("readiness: the database cannot be used: %s", exc)
        return f"unavailable ({type(exc).__name__}; the server log has the reason)"
    return "ok"
