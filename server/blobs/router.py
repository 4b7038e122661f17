"""HTTP for the local store's signed, expiring /blobs/{key} URLs (GET and PUT)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse

from server.blobs import service
from server.blobs.schemas import BlobError, BlobStored
from server.deps import SettingsDep, StoreDep
from server.routing import TransactionalRoute

router = APIRouter(tags=["blobs"], route_class=TransactionalRoute)


class BlobFileResponse(FileResponse):
    """FileResponse reading 1 MiB at a time (the default 64 KiB costs a thread hop per chunk)."""

    chunk_size = 1024 * 1024


_ERRORS: dict[int | str, dict[str, object]] = {
    code: {"model": BlobError} for code in (400, 403, 404, 412, 413)
}


@router.get("/blobs/{key:path}", responses=_ERRORS, response_class=BlobFileResponse)
def get_blob(key: str, request: Request, store: StoreDep) -> BlobFileResponse:
    """Stream one object from disk, for a URL the local store signed for GET."""
    local = service.local_store(store)
    grant = service.authorize(local, "GET", key, dict(request.query_params))
    path = service.object_path(local, grant)
    return BlobFileResponse(path, media_type="application/octet-stream")


@router.put("/blobs/{key:path}", responses=_ERRORS)
async def put_blob(
    key: str, request: Request, store: StoreDep, settings: SettingsDep
) -> BlobStored:
    """Store one object for a URL signed for PUT: exactly the signed length and sha256,
    and no overwrite when signed so (412)."""
    local = service.local_store(store)
    grant = service.authorize(local, "PUT", key, dict(request.query_params))
    no_overwrite = service.check_put_headers(
        local, grant, request.headers, settings.security.max_blob_bytes
    )
    info = await service.receive_put(local, grant, request.stream(), no_overwrite=no_overwrite)
    return BlobStored(key=info.key, size=info.size, sha256=grant.sha256_hex or "")
