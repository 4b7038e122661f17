"""protocol/transfer.py against real presigned S3 URLs (moto's server)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from protocol.storage_s3 import S3Store
from protocol.transfer import ChecksumMismatch, TransferError, download_url, upload_presigned


def test_download_refuses_a_body_whose_sha256_differs(s3_store: S3Store, tmp_path: Path) -> None:
    data = os.urandom(300_000)
    s3_store.put_bytes("x/adapter.bin", data)
    dest = tmp_path / "adapter.bin"
    wrong = hashlib.sha256(data + b"!").hexdigest()
    with pytest.raises(ChecksumMismatch):
        download_url(s3_store.presign_get("x/adapter.bin", 60), dest, wrong)
    assert not dest.exists()
    assert list(tmp_path.iterdir()) == []  # no partial file left behind


def test_download_verifies_and_replaces_atomically(s3_store: S3Store, tmp_path: Path) -> None:
    data = os.urandom(3 * 1024 * 1024 + 1)
    s3_store.put_bytes("x/a.bin", data)
    dest = tmp_path / "a.bin"
    dest.write_bytes(b"old")
    url = s3_store.presign_get("x/a.bin", 60)
    assert download_url(url, dest, hashlib.sha256(data).hexdigest().upper()) == len(data)
    assert dest.read_bytes() == data
    assert download_url(url, tmp_path / "unchecked.bin", None) == len(data)


def test_download_of_a_missing_key_is_a_transfer_error(s3_store: S3Store, tmp_path: Path) -> None:
    with pytest.raises(TransferError) as info:
        download_url(s3_store.presign_get("x/none.bin", 60), tmp_path / "n.bin", None)
    assert info.value.status_code == 404
    assert list(tmp_path.iterdir()) == []


def test_upload_from_path_and_bytes(s3_store: S3Store, tmp_path: Path) -> None:
    src = tmp_path / "b.parquet"
    src.write_bytes(os.urandom(1_500_000))
    sha = hashlib.sha256(src.read_bytes()).hexdigest()
    upload_presigned(s3_store.presign_put("b/1", size=1_500_000, sha256_hex=sha, ttl_s=60), src)
    upload_presigned(
        s3_store.presign_put("b/2", size=1_500_000, sha256_hex=sha, ttl_s=60), str(src)
    )
    data = src.read_bytes()
    upload_presigned(s3_store.presign_put("b/3", size=len(data), sha256_hex=sha, ttl_s=60), data)
    for key in ("b/1", "b/2", "b/3"):
        assert s3_store.get_bytes(key) == data


def test_upload_to_a_bad_url_raises_with_the_status(s3_store: S3Store) -> None:
    put = s3_store.presign_put(
        "b/1", size=3, sha256_hex=hashlib.sha256(b"abc").hexdigest(), ttl_s=60
    )
    broken = type(put)(
        url=put.url.replace(s3_store.bucket, "no-such-bucket-xyz"), headers=put.headers
    )
    with pytest.raises(TransferError) as info:
        upload_presigned(broken, b"abc")
    assert info.value.status_code == 404


def test_a_client_carrying_credentials_is_refused(s3_store: S3Store, tmp_path: Path) -> None:
    import httpx

    s3_store.put_bytes("x/a.bin", b"a")
    with httpx.Client(headers={"Authorization": "Bearer agw_secret"}) as http:
        with pytest.raises(ValueError):
            download_url(s3_store.presign_get("x/a.bin", 60), tmp_path / "a", None, http=http)
        put = s3_store.presign_put(
            "x/b", size=1, sha256_hex=hashlib.sha256(b"b").hexdigest(), ttl_s=60
        )
        with pytest.raises(ValueError):
            upload_presigned(put, b"b", http=http)
