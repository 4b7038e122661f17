"""The object-store interface shared by server, worker and learner (no torch, no web stack).

Two implementations: S3 through boto3 (AWS S3, MinIO, R2, Hugging Face buckets) and a local
folder whose short-lived URLs the control plane serves under /blobs/ with an HMAC signature.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path


class StoreError(Exception):
    """Base class for object-store failures."""


class ObjectExists(StoreError):
    """A conditional put (If-None-Match: *) found the key already present."""


class ObjectNotFound(StoreError):
    """The key does not exist."""


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


class ObjectStore(ABC):
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
    def delete(self, key: str) -> None: ...

    @abstractmethod
    def list(self, prefix: str) -> list[str]: ...

    @abstractmethod
    def presign_get(self, key: str, ttl_s: int) -> str: ...

    @abstractmethod
    def presign_put(
        self, key: str, *, size: int, sha256_hex: str, ttl_s: int, if_none_match: bool = False
    ) -> PresignedPut: ...
