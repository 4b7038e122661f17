"""The bucket itself (ObjectStore.bucket_exists / create_bucket): S3 on a real moto server and
the local folder. A missing bucket is BucketMissing on object calls, never a missing object
(the server's marker check would otherwise read "no marker")."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from protocol.storage import BucketMissing, ObjectNotFound, StoreError
from protocol.storage_local import LocalStore
from protocol.storage_s3 import S3Store
from tests.s3_fixtures import S3Endpoint, free_port


def _s3(endpoint_url: str, bucket: str, moto: S3Endpoint) -> S3Store:
    return S3Store(
        bucket=bucket,
        endpoint_url=endpoint_url,
        region=moto.region,
        path_style=True,
        access_key_id=moto.access_key_id,
        secret_access_key=moto.secret_access_key,
    )


def test_an_s3_bucket_is_told_missing_and_created(moto_endpoint: S3Endpoint) -> None:
    store = _s3(moto_endpoint.url, f"new-{uuid.uuid4().hex[:12]}", moto_endpoint)
    assert store.bucket_exists() is False
    with pytest.raises(BucketMissing):
        store.get_bytes("a/key")
    with pytest.raises(BucketMissing):
        store.put_bytes("a/key", b"x")
    store.create_bucket()
    store.create_bucket()  # already there: nothing
    assert store.bucket_exists() is True
    with pytest.raises(ObjectNotFound) as missing:
        store.get_bytes("a/key")
    assert not isinstance(missing.value, BucketMissing)


def test_an_unreachable_endpoint_cannot_tell(moto_endpoint: S3Endpoint) -> None:
    store = _s3(f"http://127.0.0.1:{free_port()}", "any", moto_endpoint)
    with pytest.raises(StoreError):
        store.bucket_exists()


def test_a_local_bucket_is_its_folder(tmp_path: Path) -> None:
    store = LocalStore(root=tmp_path / "b" / "c", base_url="http://x/blobs", secret_key="k" * 32)
    assert store.bucket_exists() is False
    store.create_bucket()
    store.create_bucket()
    assert store.bucket_exists() is True and (tmp_path / "b" / "c").is_dir()
