"""Builds the configured object store (S3 or a local folder) from settings."""

from __future__ import annotations

from protocol.storage import ObjectStore
from server.config import Settings


def make_store(settings: Settings) -> ObjectStore:
    from protocol.storage_local import STALE_TEMP_S, LocalStore
    from protocol.storage_s3 import S3Store

    url = settings.bucket_url
    if url.startswith("s3://"):
        bucket, _, prefix = url[len("s3://") :].partition("/")
        return S3Store(
            bucket=bucket,
            prefix=prefix,
            endpoint_url=settings.s3.endpoint_url,
            region=settings.s3.region,
            path_style=settings.s3.path_style,
            access_key_id=settings.s3.access_key_id,
            secret_access_key=settings.s3.secret_access_key,
        )
    root = url[len("file://") :] if url.startswith("file://") else url
    store = LocalStore(
        root=root,
        base_url=settings.public_url.rstrip("/") + "/blobs",
        secret_key=settings.secret_key(),
    )
    store.sweep_stale_temps(STALE_TEMP_S)  # PUTs cut off by a crash of an earlier process
    return store
