"""server/storage_factory.py builds the store the settings name."""

from __future__ import annotations

from pathlib import Path

from protocol.storage_local import LocalStore
from protocol.storage_s3 import S3Store
from server.config import S3Settings, Settings
from server.storage_factory import make_store
from tests.conftest import TEST_SECRET
from tests.s3_fixtures import S3Endpoint


def _settings(bucket_url: str, **kw: object) -> Settings:
    return Settings(
        database_url="sqlite:///unused.db",
        bucket_url=bucket_url,
        public_url="http://cp.example:8000/",
        security={"secret_key": TEST_SECRET},
        **kw,  # type: ignore[arg-type]
    )


def test_local_folder_and_file_url(tmp_path: Path) -> None:
    for url in (str(tmp_path / "b"), f"file://{tmp_path / 'b'}"):
        store = make_store(_settings(url))
        assert isinstance(store, LocalStore)
        assert store.root == (tmp_path / "b").resolve()
        assert store.presign_get("a.bin", 60).startswith("http://cp.example:8000/blobs/a.bin?")


def test_s3_url_with_prefix(moto_endpoint: S3Endpoint, s3_bucket: str) -> None:
    s3 = S3Settings(
        endpoint_url=moto_endpoint.url,
        region="eu-west-1",
        path_style=True,
        access_key_id=moto_endpoint.access_key_id,
        secret_access_key=moto_endpoint.secret_access_key,
    )
    store = make_store(_settings(f"s3://{s3_bucket}/team/x", s3=s3))
    assert isinstance(store, S3Store)
    assert (store.bucket, store.prefix) == (s3_bucket, "team/x")
    assert "eu-west-1" in store.presign_get("k", 60)
    store.put_bytes("k", b"v")
    assert (
        moto_endpoint.client().head_object(Bucket=s3_bucket, Key="team/x/k")["ContentLength"] == 1
    )
