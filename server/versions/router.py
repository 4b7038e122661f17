"""GET /api/v1/versions: a worker's long-poll for new adapter versions of the runs it serves
(docs/architecture/protocol.md, "Version long-poll"), answered from this process's watch."""

from __future__ import annotations

import asyncio
import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response, status

from protocol.schemas import MAX_VERSIONS_AFTER, VersionsResponse
from server.config import Settings
from server.deps import WorkerCredentials, as_worker
from server.long_poll import long_poll
from server.versions import service
from server.versions.watch import RunVersion, VersionWatch

# One try: the change event taken before reading, and the newer versions read.
_Tried = tuple[asyncio.Event, dict[uuid.UUID, RunVersion]]

router = APIRouter(prefix="/api/v1", tags=["versions"])


@router.get(
    "/versions",
    response_model=VersionsResponse,
    responses={204: {"description": "Nothing newer than `after` within the long-poll."}},
)
async def versions(
    request: Request,
    credentials: WorkerCredentials,
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
    """The running runs of the worker's base models and of the projects it serves whose
    version is newer than `after` says,
    with their adapter downloads; waits (on the event loop, holding nothing) up to wait_s for
    one, then 204."""
    models, project_id = await as_worker(
        request, credentials, lambda _session, worker: (list(worker.models), worker.project_id)
    )
    named = service.parse_after(after)  # after authentication: a stranger learns nothing (401)
    settings: Settings = request.app.state.settings
    watch: VersionWatch = request.app.state.version_watch

    async def attempt(deadline: float) -> _Tried:
        changed = watch.change()  # taken before reading: a change after the read wakes us
        return changed, service.newer(
            await watch.current(wanted_until=deadline), models, project_id, named
        )

    async def until_changed(tried: _Tried, remaining: float) -> None:
        try:
            await asyncio.wait_for(tried[0].wait(), remaining)
        except TimeoutError:
            pass

    _changed, found = await long_poll(
        attempt, lambda tried: bool(tried[1]), wait_s, settings, pause=until_changed
    )
    if not found:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    return VersionsResponse(versions=service.notices(request.app.state.store, settings, found))
