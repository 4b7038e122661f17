"""The object-store interface shared by server, worker and learner (no torch, no web stack).

Two implementations: S3 through boto3 (AWS S3, MinIO, R2, Hugging Face buckets) and a local
folder whose short-lived URLs the control plane serves under /blobs/ with an HMAC signature.
"""

from __future__ import annotations

import base64
import hashlib
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path

MAX_KEY_BYTES = 1024
_HEX = frozenset("0123456789abcdef")


class StoreError(Exception):
    """Base class for object-store failures."""


class InvalidKey(StoreError, ValueError):
    """A key that could escape its folder or that a store would mangle."""


class ObjectExists(StoreError):
    """A conditional put (If-None-Match: *) found the key already present."""


class ObjectNotFound(StoreError):
    """The key does not exist."""


class BucketMissing(StoreError):
    """The bucket itself does not exist (S3's NoSuchBucket): not an outage, nothing to retry."""


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int


@dataclass(frozen=True)
class PresignedPut:
    """A URL bound to one key; the client must send exactly these headers with the body."""

    url: str
    headers: dict[str, str] = field(default_factory=dict)
    expires_in_s: int = 0


_CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f]")


def validate_key(key: str) -> str:
    """Return `key` if it is a safe object key, else raise InvalidKey.

    Refused: empty keys, a leading `/`, `\\`, control characters, empty, `.` or `..`
    segments, and keys over 1024 UTF-8 bytes (S3's limit)."""
    if not isinstance(key, str) or not key:
        raise InvalidKey("object key must be a non-empty string")
    if key.startswith("/"):
        raise InvalidKey(f"object key must not start with '/': {key!r}")
    if "\\" in key:
        raise InvalidKey(f"object key must not contain a backslash: {key!r}")
    if _CONTROL_CHARACTER.search(key):
        raise InvalidKey(f"object key must not contain control characters: {key!r}")
    if len(key.encode("utf-8")) > MAX_KEY_BYTES:
        raise InvalidKey(f"object key longer than {MAX_KEY_BYTES} bytes")
    for segment in key.split("/"):
        if segment in ("", ".", ".."):
            raise InvalidKey(f"object key has an empty, '.' or '..' segment: {key!r}")
    return key


def validate_prefix(prefix: str) -> str:
    """A list prefix: empty, or a key-like string (a trailing '/' allowed)."""
    if prefix:
        validate_key(prefix[:-1] if prefix.endswith("/") and len(prefix) > 1 else prefix)
    return prefix


def validate_sha256_hex(sha256_hex: str) -> str:
    """Lower-case 64-digit hex, as hashlib's hexdigest() gives."""
    if len(sha256_hex) != 64 or not set(sha256_hex) <= _HEX:
        raise ValueError("sha256 must be 64 lower-case hex digits")
    return sha256_hex


def sha256_b64(sha256_hex: str) -> str:
    """The base64 of the digest, as S3's ChecksumSHA256 wants it."""
    return base64.b64encode(bytes.fromhex(validate_sha256_hex(sha256_hex))).decode("ascii")


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """The hex sha256 of a file, read in chunks: the one file-hash helper of every package."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


class ObjectStore(ABC):
    """put/get/head/delete/list plus short-lived URLs bound to one key.

    Every method validates its key with `validate_key` (InvalidKey otherwise). A put with
    `if_none_match=True` raises ObjectExists when the key is already there, atomically."""

    @abstractmethod
    def bucket_exists(self) -> bool:
        """Whether the bucket (S3) or the root folder (local) exists; StoreError when it cannot
        be told (the endpoint is down, access is refused)."""

    @abstractmethod
    def create_bucket(self) -> None:
        """Create the bucket (or folder); nothing when it already exists."""

    @abstractmethod
    def put_bytes(self, key: str, data: bytes, *, if_none_match: bool = False) -> ObjectInfo: ...

    @abstractmethod
    def put_file(self, key: str, path: Path, *, if_none_match: bool = False) -> ObjectInfo: ...

    @abstractmethod
    def get_bytes(self, key: str) -> bytes: ...

    @abstractmethod
    def download_file(self, key: str, path: Path) -> None: ...

    @abstractmethod
    def head(self, key: str) -> ObjectInfo | None: ...

    @abstractmethod
    def sha256(self, key: str) -> str | None:
        """The stored object's hex sha256 (the digest its signed PUT enforced), or None when the
        object is missing or the store kept no checksum for it."""

    @abstractmethod
    def delete(self, key: str) -> None: ...

    @abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Keys starting with `prefix` (a plain string prefix, as S3), sorted."""

    @abstractmethod
    def presign_get(self, key: str, ttl_s: int) -> str: ...

    @abstractmethod
    def presign_put(
        self, key: str, *, size: int, sha256_hex: str, ttl_s: int, if_none_match: bool = False
    ) -> PresignedPut:
        """A URL that accepts exactly one body: `size` bytes whose sha256 is `sha256_hex`,
        for `ttl_s` seconds; with `if_none_match`, only while the key does not exist."""
