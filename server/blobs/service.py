"""Rules of the local store's signed /blobs/ URLs: verify, then stream to or from disk.

A PUT is written to a temp file next to the objects while it is counted and hashed; it is
committed (atomically, refusing an overwrite when the URL says so) only when its length and
sha256 are exactly the signed ones. Every refusal is an AppError (JSON 4xx), never a 500.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from starlette.requests import ClientDisconnect

from protocol.error_codes import ErrorCode
from protocol.storage import ObjectExists, ObjectInfo, ObjectStore
from protocol.storage_local import LocalStore, SignedRequest, URLRefused
from server.errors import AppError, BadRequest, Forbidden, NotFound, PayloadTooLarge


class PreconditionFailed(AppError):
    """A no-overwrite PUT whose key already exists (S3 answers 412 too)."""

    status_code = 412


def local_store(store: ObjectStore) -> LocalStore:
    """The store, if it is the local folder; signed /blobs/ URLs exist only for that one."""
    if not isinstance(store, LocalStore):
        raise NotFound(
            "this server's bucket is S3: blob URLs are presigned S3 URLs",
            code=ErrorCode.blobs_not_served,
        )
    return store


def authorize(store: LocalStore, method: str, key: str, query: Mapping[str, str]) -> SignedRequest:
    try:
        return store.verify(method, key, query)
    except URLRefused as exc:
        raise Forbidden(str(exc), code=ErrorCode.signature_invalid) from None


def object_path(store: LocalStore, grant: SignedRequest) -> Path:
    path = store.path_for(grant.key)
    if not path.is_file():
        raise NotFound(f"no object at {grant.key!r}", code=ErrorCode.object_not_found)
    return path


def check_put_headers(
    store: LocalStore, grant: SignedRequest, headers: Mapping[str, str], max_blob_bytes: int
) -> bool:
    """Refuse before reading the body when the headers already break the signed conditions;
    returns whether the put must not overwrite."""
    assert grant.size is not None
    if grant.size > max_blob_bytes:
        raise PayloadTooLarge(
            f"signed length {grant.size} is over the {max_blob_bytes}-byte limit",
            code=ErrorCode.blob_too_large,
        )
    declared = headers.get("content-length")
    if declared is not None and declared.strip() != str(grant.size):
        raise Forbidden(
            f"Content-Length {declared} is not the signed length {grant.size}",
            code=ErrorCode.length_mismatch,
        )
    no_overwrite = grant.if_none_match or headers.get("if-none-match", "").strip() == "*"
    if no_overwrite and store.head(grant.key) is not None:
        raise PreconditionFailed(
            f"{grant.key!r} already exists and this URL may not overwrite",
            code=ErrorCode.object_exists,
        )
    return no_overwrite


async def _until_disconnect(body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    try:
        async for chunk in body:
            yield chunk
    except ClientDisconnect:
        raise BadRequest(
            "client disconnected before the body was complete", code=ErrorCode.body_incomplete
        ) from None


async def receive_put(
    store: LocalStore, grant: SignedRequest, body: AsyncIterator[bytes], *, no_overwrite: bool
) -> ObjectInfo:
    """Stream the body to a temp file, check length and sha256, then commit atomically."""
    assert grant.size is not None and grant.sha256_hex is not None
    tmp = store.new_temp()
    try:
        digest = hashlib.sha256()
        size = 0
        with open(tmp, "wb") as f:
            async for chunk in _until_disconnect(body):
                size += len(chunk)
                if size > grant.size:
                    raise PayloadTooLarge(
                        f"body longer than the signed {grant.size} bytes",
                        code=ErrorCode.blob_too_large,
                    )
                digest.update(chunk)
                f.write(chunk)
        if size != grant.size:
            raise BadRequest(
                f"body is {size} bytes, the signed length is {grant.size}",
                code=ErrorCode.body_length_mismatch,
            )
        if digest.hexdigest() != grant.sha256_hex:
            raise BadRequest(
                f"body sha256 {digest.hexdigest()} is not the signed {grant.sha256_hex}",
                code=ErrorCode.bad_digest,
            )
        try:
            return store.commit_temp(tmp, grant.key, if_none_match=no_overwrite)
        except ObjectExists:
            raise PreconditionFailed(
                f"{grant.key!r} already exists", code=ErrorCode.object_exists
            ) from None
    finally:
        tmp.unlink(missing_ok=True)
