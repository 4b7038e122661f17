"""The local store's signed /blobs/ URLs through the real app (TestClient serves
http://testserver, which is settings.public_url in tests), driven by protocol/transfer.py."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from protocol.storage import ObjectExists, PresignedPut
from protocol.storage_local import TMP_DIR, LocalStore
from protocol.transfer import ChecksumMismatch, TransferError, download_url, upload_presigned

DATA = os.urandom(256 * 1024 + 3)
SHA = hashlib.sha256(DATA).hexdigest()
KEY = "runs/r1/batches/lease-1.parquet"


@pytest.fixture
def store(app) -> LocalStore:  # type: ignore[no-untyped-def]
    s: LocalStore = app.state.store
    return s


def _put(store: LocalStore, **kw: object) -> PresignedPut:
    args: dict = {"size": len(DATA), "sha256_hex": SHA, "ttl_s": 60, "if_none_match": True}
    return store.presign_put(KEY, **(args | kw))  # type: ignore[arg-type]


def test_put_then_get_round_trip(client: TestClient, store: LocalStore, tmp_path: Path) -> None:
    put = _put(store)
    assert put.url.startswith("http://testserver/blobs/runs/r1/batches/lease-1.parquet?")
    upload_presigned(put, DATA, http=client)
    assert store.get_bytes(KEY) == DATA
    dest = tmp_path / "back.parquet"
    assert download_url(store.presign_get(KEY, 60), dest, SHA, http=client) == len(DATA)
    assert dest.read_bytes() == DATA


def test_streamed_file_upload(client: TestClient, store: LocalStore, tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(5 * 1024 * 1024))
    sha = hashlib.sha256(src.read_bytes()).hexdigest()
    put = store.presign_put("big/x.bin", size=src.stat().st_size, sha256_hex=sha, ttl_s=60)
    upload_presigned(put, src, http=client)
    assert store.get_bytes("big/x.bin") == src.read_bytes()


def test_refuses_an_overwrite(client: TestClient, store: LocalStore) -> None:
    upload_presigned(_put(store), DATA, http=client)
    with pytest.raises(ObjectExists):
        upload_presigned(_put(store), DATA, http=client)
    r = client.put(_put(store).url, content=DATA)
    assert r.status_code == 412 and "already exists" in r.json()["detail"]
    # A URL signed without the flag may overwrite.
    upload_presigned(_put(store, if_none_match=False), DATA, http=client)


def test_expired_urls_are_refused(client: TestClient, store: LocalStore) -> None:
    store.put_bytes(KEY + ".old", DATA)
    past = LocalStore(
        store.root,
        store.base_url,
        client.app.state.settings.secret_key(),
        clock=lambda: 1_000_000.0,
    )
    r = client.put(
        past.presign_put(KEY, size=len(DATA), sha256_hex=SHA, ttl_s=60).url, content=DATA
    )
    assert r.status_code == 403 and "expired" in r.json()["detail"]
    r = client.get(past.presign_get(KEY + ".old", 60))
    assert r.status_code == 403 and "expired" in r.json()["detail"]
    assert store.head(KEY) is None


def test_refuses_another_key(client: TestClient, store: LocalStore) -> None:
    put = _put(store)
    other = put.url.replace("lease-1.parquet", "lease-2.parquet")
    r = client.put(other, content=DATA, headers=put.headers)
    assert r.status_code == 403
    store.put_bytes("secret/other.bin", b"no")
    get = store.presign_get(KEY, 60).replace(KEY, "secret/other.bin")
    assert client.get(get).status_code == 403
    assert store.head("runs/r1/batches/lease-2.parquet") is None


def test_refuses_a_tampered_signature(client: TestClient, store: LocalStore) -> None:
    url = _put(store).url
    sig = url.rsplit("sig=", 1)[1]
    flipped = url.replace("sig=" + sig, "sig=" + sig[::-1])
    assert client.put(flipped, content=DATA).status_code == 403
    raised = url.replace("nx=1", "nx=0")
    assert client.put(raised, content=DATA).status_code == 403
    unsigned = url.split("?", 1)[0]
    assert client.put(unsigned, content=DATA).status_code == 403
    assert client.get(unsigned).status_code == 403
    assert store.head(KEY) is None


def test_refuses_a_body_of_another_length(client: TestClient, store: LocalStore) -> None:
    url = _put(store).url
    # A Content-Length other than the signed one: refused before the body is read.
    r = client.put(url, content=DATA[:-1])
    assert r.status_code == 403 and "signed length" in r.json()["detail"]
    # Streamed (chunked) bodies are counted: longer is 413, shorter is 400.
    r = client.put(url, content=_chunks(DATA + b"extra"))
    assert r.status_code == 413
    r = client.put(url, content=_chunks(DATA[:1000]))
    assert r.status_code == 400 and "signed length" in r.json()["detail"]
    assert store.head(KEY) is None
    assert list((store.root / TMP_DIR).iterdir()) == []


def test_refuses_a_body_of_another_sha256(client: TestClient, store: LocalStore) -> None:
    forged = bytes([DATA[0] ^ 1]) + DATA[1:]
    with pytest.raises(TransferError) as info:
        upload_presigned(_put(store), forged, http=client)
    assert info.value.status_code == 400 and "bad_digest" in info.value.body
    assert store.head(KEY) is None
    assert list((store.root / TMP_DIR).iterdir()) == []


def test_download_refuses_a_body_whose_sha256_differs(
    client: TestClient, store: LocalStore, tmp_path: Path
) -> None:
    store.put_bytes(KEY, DATA)
    with pytest.raises(ChecksumMismatch):
        download_url(store.presign_get(KEY, 60), tmp_path / "x", "0" * 64, http=client)
    assert not (tmp_path / "x").exists()


def test_missing_object_is_404(client: TestClient, store: LocalStore) -> None:
    r = client.get(store.presign_get("nothing/here.bin", 60))
    assert r.status_code == 404


def test_blob_size_limit(client: TestClient, store: LocalStore) -> None:
    client.app.state.settings.security.max_blob_bytes = len(DATA) - 1
    r = client.put(_put(store).url, content=DATA)
    assert r.status_code == 413 and "limit" in r.json()["detail"]
    assert store.head(KEY) is None


def _chunks(data: bytes, size: int = 65536) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def test_no_blob_urls_when_the_bucket_is_s3(settings, moto_endpoint, s3_bucket) -> None:  # type: ignore[no-untyped-def]
    from server.app import create_app
    from server.config import S3Settings
    from tests.conftest import TEST_SECRET

    s3_settings = settings.model_copy(
        update={
            "bucket_url": f"s3://{s3_bucket}/pre",
            "s3": S3Settings(
                endpoint_url=moto_endpoint.url,
                path_style=True,
                access_key_id=moto_endpoint.access_key_id,
                secret_access_key=moto_endpoint.secret_access_key,
            ),
        }
    )
    app = create_app(s3_settings, migrate=False)
    try:
        with TestClient(app) as s3_client:
            forged = LocalStore("/nonexistent", "http://testserver/blobs", TEST_SECRET)
            r = s3_client.get(forged.presign_get("a.bin", 60))
            assert r.status_code == 404 and "S3" in r.json()["detail"]
            store = app.state.store
            store.put_bytes("a.bin", b"via s3")
            assert (
                moto_endpoint.client().get_object(Bucket=s3_bucket, Key="pre/a.bin")["Body"].read()
                == b"via s3"
            )
    finally:
        app.state.engine.dispose()
