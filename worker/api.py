"""The worker's calls on the control plane, typed with protocol.schemas.

Built on `AsyncGrpoClient.request` (retries on transient failures, ApiError subclasses on
refusals). If protocol/client.py grows its own worker methods, these thin wrappers can delegate
to them; the loop only depends on this module.
"""

from __future__ import annotations

import uuid

from protocol.client import AsyncGrpoClient
from protocol.schemas import (
    BatchManifest,
    CompleteRequest,
    CompleteResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    Lease,
    LeaseAcquireRequest,
    ReleaseRequest,
    ReleaseResponse,
    UploadRequest,
    UploadResponse,
)

LEASES = "/api/v1/leases"


def acquire(
    client: AsyncGrpoClient, models: list[str] | None, wait_s: float, timeout_s: float
) -> Lease | None:
    """A lease, or None when the server answers 204 (no admissible work)."""
    body = LeaseAcquireRequest(models=models, wait_s=wait_s).model_dump(mode="json")
    response = client.request("POST", f"{LEASES}/acquire", json=body, timeout_s=timeout_s + wait_s)
    if response.status_code == 204:
        return None
    return Lease.model_validate(response.json())


def heartbeat(client: AsyncGrpoClient, lease_id: uuid.UUID, fencing: int) -> HeartbeatResponse:
    body = HeartbeatRequest(fencing=fencing).model_dump(mode="json")
    response = client.request("POST", f"{LEASES}/{lease_id}/heartbeat", json=body)
    return HeartbeatResponse.model_validate(response.json())


def upload_url(
    client: AsyncGrpoClient, lease_id: uuid.UUID, fencing: int, size: int, sha256: str
) -> UploadResponse:
    body = UploadRequest(fencing=fencing, size=size, sha256=sha256).model_dump(mode="json")
    response = client.request("POST", f"{LEASES}/{lease_id}/upload", json=body)
    return UploadResponse.model_validate(response.json())


def complete(
    client: AsyncGrpoClient, lease_id: uuid.UUID, fencing: int, manifest: BatchManifest
) -> CompleteResponse:
    body = CompleteRequest(fencing=fencing, manifest=manifest).model_dump(mode="json")
    response = client.request("POST", f"{LEASES}/{lease_id}/complete", json=body)
    return CompleteResponse.model_validate(response.json())


def release(
    client: AsyncGrpoClient, lease_id: uuid.UUID, fencing: int, timeout_s: float | None = None
) -> ReleaseResponse:
    body = ReleaseRequest(fencing=fencing).model_dump(mode="json")
    response = client.request(
        "POST", f"{LEASES}/{lease_id}/release", json=body, timeout_s=timeout_s
    )
    return ReleaseResponse.model_validate(response.json())
