"""Wire models of the local store's signed blob URLs."""

from __future__ import annotations

from pydantic import BaseModel, Field

from protocol.error_codes import ErrorCode


class BlobStored(BaseModel):
    """The answer to an accepted PUT on a signed /blobs/ URL."""

    key: str = Field(description="Object key the body was stored under.")
    size: int = Field(description="Bytes stored (the signed length).")
    sha256: str = Field(description="Hex sha256 of the stored bytes (the signed digest).")


class BlobError(BaseModel):
    """A refused blob request (403 signature/expiry/key/length header, 404, 412 overwrite,
    413 too large, 400 body digest or short body)."""

    detail: str = Field(description="Why the request was refused.")
    code: ErrorCode = Field(
        description="The error code (docs/guides/troubleshooting.md), e.g. `bad_digest`."
    )
