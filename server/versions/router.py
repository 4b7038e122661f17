"""GET /api/v1/versions: a worker's long-poll for new adapter versions of the runs it serves
(docs/architecture.md, "Version long-poll"), answered from this process's watch."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response, status

from protocol.schemas import MAX_VERSIONS_AFTER, VersionsResponse
from server.config import Settings
from server.deps import Credentials, as_worker
from server.versions import service
from server.versions.watch import VersionWatch

router = APIRouter(prefix="/api/v1", tags=["versions"])


@router.get(
    "/versions",
    response_model=VersionsResponse,
    responses={204: {"description": "Nothing newer than `after` within the long-poll."}},
)
async def versions(
    request: Request,
    credentials: Credentials,
    after: Annotated[
        list[str],
        Query(
            description=f"'<run_id>:<version>' per run the worker knows (at most "
            f"{MAX_VERSIONS_AFTER}); a run not named is reported once past version 0.",
        ),
    ] = [],  # noqa: B006 - FastAPI copies query defaults
    wait_s: Annotated[
        float,
        Query(ge=0, le=600, description="Long-poll up to this long (capped by the server)."),
    ] = 0.0,
) -> VersionsResponse | Response:
    """The running runs of the worker's base models whose version is newer than `after` says,
    with their adapter downloads; waits (on the event loop, holding nothing) up to wait_s for
    one, then 204."""
    models = await as_worker(request, credentials, lambda _session, worker: list(worker.models))
    named = service.parse_after(after)  # after authentication: a stranger learns nothing (401)
    settings: Settings = request.app.state.settings
    watch: VersionWatch = request.app.state.version_watch
    deadline = time.monotonic() + min(wait_s, settings.lease_long_poll_s)
    while True:
        changed = watch.change()
        found = service.newer(await watch.current(wanted_until=deadline), models, named)
        remaining = deadline - time.monotonic()
        if found or remaining <= 0:
            break
        try:
            await asyncio.wait_for(changed.wait(), remaining)
        except TimeoutError:
            pass
    if not found:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    return VersionsResponse(versions=service.notices(request.app.state.store, settings, found))
