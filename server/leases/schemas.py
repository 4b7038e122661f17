"""The lease endpoints' wire models live in protocol.schemas (shared with the worker)."""

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

__all__ = [
    "BatchManifest",
    "CompleteRequest",
    "CompleteResponse",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "Lease",
    "LeaseAcquireRequest",
    "ReleaseRequest",
    "ReleaseResponse",
    "UploadRequest",
    "UploadResponse",
]
