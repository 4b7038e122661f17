"""Admin reads of adapter versions. (The learner's publish endpoint is in server/learner.)"""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Path

from server.adapters import service
from server.adapters.schemas import AdapterVersionDetail, AdapterVersionOut
from server.deps import SessionDep, SettingsDep, StoreDep
from server.routing import TransactionalRoute
from server.tokens.access import RunReader

router = APIRouter(prefix="/api/v1/runs", tags=["adapters"], route_class=TransactionalRoute)

DOWNLOAD_TTL_S = 900


@router.get("/{run_id}/adapters", response_model=list[AdapterVersionOut])
def list_adapters(
    run_id: uuid.UUID, session: SessionDep, _caller: RunReader
) -> list[AdapterVersionOut]:
    """The run's published versions, oldest first (404 for an unknown run)."""
    return service.list_versions(session, run_id)


@router.get("/{run_id}/adapters/{version}", response_model=AdapterVersionDetail)
def get_adapter(
    run_id: uuid.UUID,
    version: Annotated[
        str,
        Path(
            pattern=r"^([0-9]{1,9}|latest|final|best)$",  # \d would take other scripts' digits
            description="A version number, `latest`, `final` or `best` (the best version by "
            "the run's best metric, kept by retention).",
        ),
    ],
    session: SessionDep,
    store: StoreDep,
    settings: SettingsDep,
    _caller: RunReader,
) -> AdapterVersionDetail:
    """One version with short-lived download URLs; 404 when there is none, 410 when retention
    deleted its files."""
    ttl = min(settings.security.url_ttl_s, DOWNLOAD_TTL_S)
    return service.get_version(session, store, run_id, version, ttl)
