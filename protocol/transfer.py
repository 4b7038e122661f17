"""Client-side transfers through short-lived URLs (worker and learner; httpx, streaming).

`upload_presigned(put, source)` sends a file or bytes to a PresignedPut with exactly its
headers; `download_url(url, dest, expected_sha256)` streams a URL to a file, hashing as it goes,
and only moves the file into place when the digest matches. Both work against S3 presigned URLs
and the control plane's signed /blobs/ URLs alike.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import httpx

from protocol.retrying import retry_call
from protocol.storage import ObjectExists, PresignedPut, StoreError

CHUNK = 1 << 20
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
T = TypeVar("T")
DEFAULT_TIMEOUT = httpx.Timeout(30.0, read=120.0, write=120.0)
RETRY_BASE_S, RETRY_CAP_S = 0.25, 4.0  # the waits between a transfer's tries


class TransferError(StoreError):
    """An upload or download that the other side refused (status and body kept)."""

    def __init__(self, message: str, status_code: int | None = None, body: str = "") -> None:
        super().__init__(message)
        self.status_code = status_code
        self.body = body


class ChecksumMismatch(TransferError):
    """The downloaded bytes do not hash to the expected sha256."""


def _file_chunks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            yield block


def _client(http: httpx.Client | None) -> httpx.Client:
    """The given client, refused if it carries credentials (a presigned URL is its own
    credential; a bearer token must never reach a bucket host), or a fresh one."""
    if http is None:
        return httpx.Client(timeout=DEFAULT_TIMEOUT)
    if "authorization" in http.headers or http.auth is not None:
        raise ValueError("pass an httpx.Client without credentials for presigned URLs")
    return http


def is_retryable(exc: BaseException) -> bool:
    """A transfer failure that waiting can cure: a transport error (raw, or once wrapped in a
    TransferError without a status) or a retryable status; never a checksum mismatch."""
    if isinstance(exc, ChecksumMismatch):
        return False
    if isinstance(exc, TransferError):
        return exc.status_code is None or exc.status_code in RETRY_STATUSES
    return isinstance(exc, httpx.TransportError)


def _with_retries(attempts: int, call: Callable[[], T]) -> T:
    """Up to `attempts` tries of `call`, retrying transport errors and TransferErrors with a
    retryable status on the one retry policy (protocol/retrying.py)."""
    try:
        return retry_call(
            call,
            transient=is_retryable,
            base_s=RETRY_BASE_S,
            cap_s=RETRY_CAP_S,
            sleep=time.sleep,
            attempts=attempts,
        )
    except httpx.TransportError as exc:
        raise TransferError(f"transfer failed: {exc!r}") from exc


def upload_presigned(
    put: PresignedPut,
    source: Path | str | bytes,
    *,
    http: httpx.Client | None = None,
    attempts: int = 3,
) -> None:
    """PUT `source` (a path or bytes) to `put.url` with exactly `put.headers`.

    Raises ObjectExists on 412 (a no-overwrite URL whose key exists) and TransferError on any
    other refusal. Retries transport errors and 429/5xx; a retry of a no-overwrite PUT whose
    first try did land answers ObjectExists, which the caller can confirm with a HEAD."""
    client = _client(http)

    def once() -> None:
        content = source if isinstance(source, bytes) else _file_chunks(Path(source))
        response = client.put(put.url, content=content, headers=put.headers)
        if response.status_code == 412:
            raise ObjectExists(f"{put.url.split('?', 1)[0]} already exists")
        if response.status_code >= 300:
            raise TransferError(
                f"upload refused: HTTP {response.status_code}",
                response.status_code,
                response.text[:2000],
            )

    try:
        _with_retries(attempts, once)
    finally:
        if http is None:
            client.close()


def download_url(
    url: str,
    dest: Path | str,
    expected_sha256: str | None,
    *,
    http: httpx.Client | None = None,
    attempts: int = 3,
) -> int:
    """Stream `url` to `dest`, verifying sha256 when given; returns the byte count.

    The body goes to `dest.part` first and is moved into place only when its digest matches
    (ChecksumMismatch otherwise, and nothing is left behind)."""
    dest = Path(dest)
    tmp = dest.with_name(dest.name + ".part")
    client = _client(http)

    def once() -> int:
        digest = hashlib.sha256()
        size = 0
        with client.stream("GET", url) as response:
            if response.status_code >= 300:
                response.read()
                raise TransferError(
                    f"download refused: HTTP {response.status_code}",
                    response.status_code,
                    response.text[:2000],
                )
            with open(tmp, "wb") as f:
                for block in response.iter_bytes():
                    digest.update(block)
                    f.write(block)
                    size += len(block)
        if expected_sha256 is not None and digest.hexdigest() != expected_sha256.lower():
            raise ChecksumMismatch(
                f"sha256 of {url.split('?', 1)[0]} is {digest.hexdigest()}, "
                f"expected {expected_sha256}"
            )
        os.replace(tmp, dest)
        return size

    try:
        return _with_retries(attempts, once)
    finally:
        tmp.unlink(missing_ok=True)
        if http is None:
            client.close()
