"""S3Store against moto's S3 server: what the presigned URLs sign, and prefixes.

moto enforces If-None-Match but not expiry nor a signed ChecksumSHA256 (moto 5), so those
conditions are checked here by reading the SigV4 query of the generated URLs; S3 itself refuses
a request whose signed headers differ."""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from protocol.storage import ObjectExists, PresignedPut
from protocol.storage_s3 import S3Store
from protocol.transfer import download_url, upload_presigned
from tests.s3_fixtures import S3Endpoint

MB = 1024 * 1024


def _query(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}


def test_presigned_put_signs_length_checksum_and_if_none_match(s3_store: S3Store) -> None:
    data = os.urandom(4096)
    sha = hashlib.sha256(data).hexdigest()
    put = s3_store.presign_put(
        "runs/r/batches/l-1.parquet", size=4096, sha256_hex=sha, ttl_s=300, if_none_match=True
    )
    q = _query(put.url)
    assert q["X-Amz-Algorithm"] == "AWS4-HMAC-SHA256"
    assert q["X-Amz-Expires"] == "300"
    signed = set(q["X-Amz-SignedHeaders"].split(";"))
    assert signed == {"content-length", "host", "if-none-match", "x-amz-checksum-sha256"}
    assert urlsplit(put.url).path == f"/{s3_store.bucket}/runs/r/batches/l-1.parquet"
    # The headers the client must send are exactly the signed ones (host comes from the URL).
    assert {h.lower() for h in put.headers} == signed - {"host"}
    assert put.headers["Content-Length"] == "4096"
    assert base64.b64decode(put.headers["x-amz-checksum-sha256"]) == hashlib.sha256(data).digest()
    assert put.headers["If-None-Match"] == "*"


def test_presigned_put_without_if_none_match_and_get_expiry(s3_store: S3Store) -> None:
    put = s3_store.presign_put("k.bin", size=1, sha256_hex="0" * 64, ttl_s=60)
    signed = set(_query(put.url)["X-Amz-SignedHeaders"].split(";"))
    assert signed == {"content-length", "host", "x-amz-checksum-sha256"}
    assert "If-None-Match" not in put.headers
    get_q = _query(s3_store.presign_get("k.bin", 120))
    assert get_q["X-Amz-Expires"] == "120" and get_q["X-Amz-SignedHeaders"] == "host"
    with pytest.raises(ValueError):
        s3_store.presign_get("k.bin", 0)
    with pytest.raises(ValueError):
        s3_store.presign_put("k.bin", size=1, sha256_hex="not-hex", ttl_s=60)


def test_presigned_put_and_get_round_trip(s3_store: S3Store, tmp_path: Path) -> None:
    src = tmp_path / "batch.parquet"
    src.write_bytes(os.urandom(2 * MB + 5))
    sha = hashlib.sha256(src.read_bytes()).hexdigest()
    put = s3_store.presign_put(
        "runs/r/batches/a-7.parquet",
        size=src.stat().st_size,
        sha256_hex=sha,
        ttl_s=300,
        if_none_match=True,
    )
    upload_presigned(put, src)
    head = s3_store.head("runs/r/batches/a-7.parquet")
    assert head is not None and head.size == src.stat().st_size
    dest = tmp_path / "back.parquet"
    n = download_url(s3_store.presign_get("runs/r/batches/a-7.parquet", 60), dest, sha)
    assert n == src.stat().st_size and dest.read_bytes() == src.read_bytes()
    # The signed If-None-Match: * makes S3 (and moto) refuse a second upload with 412.
    with pytest.raises(ObjectExists):
        upload_presigned(put, src)


def test_presigned_put_from_bytes(s3_store: S3Store) -> None:
    data = b"adapter bytes" * 100
    put = s3_store.presign_put(
        "a/v1.bin", size=len(data), sha256_hex=hashlib.sha256(data).hexdigest(), ttl_s=60
    )
    upload_presigned(put, data)
    assert s3_store.get_bytes("a/v1.bin") == data


def test_large_put_file_goes_multipart(
    moto_endpoint: S3Endpoint, s3_bucket: str, tmp_path: Path
) -> None:
    store = S3Store(
        bucket=s3_bucket,
        endpoint_url=moto_endpoint.url,
        path_style=True,
        access_key_id=moto_endpoint.access_key_id,
        secret_access_key=moto_endpoint.secret_access_key,
        multipart_threshold=5 * MB,
        part_size=5 * MB,
    )
    src = tmp_path / "12mb.bin"
    src.write_bytes(os.urandom(12 * MB))
    store.put_file("mp/blob.bin", src)
    etag = store.client.head_object(Bucket=store.bucket, Key="mp/blob.bin")["ETag"]
    assert etag.strip('"').endswith("-3")  # a multipart ETag: three parts
    assert store.get_bytes("mp/blob.bin") == src.read_bytes()
    # No multipart upload is left dangling after a refused conditional completion.
    with pytest.raises(ObjectExists):
        store.put_file("mp/blob.bin", src, if_none_match=True)
    uploads = store.client.list_multipart_uploads(Bucket=store.bucket)
    assert uploads.get("Uploads", []) == []


def test_prefix_scopes_keys(moto_endpoint: S3Endpoint, s3_bucket: str) -> None:
    def make(prefix: str) -> S3Store:
        return S3Store(
            bucket=s3_bucket,
            prefix=prefix,
            endpoint_url=moto_endpoint.url,
            region=moto_endpoint.region,
            path_style=True,
            access_key_id=moto_endpoint.access_key_id,
            secret_access_key=moto_endpoint.secret_access_key,
        )

    a, b = make("team-a/"), make("team-b")
    a.put_bytes("runs/x.bin", b"a")
    b.put_bytes("runs/x.bin", b"b")
    assert a.list("runs/") == ["runs/x.bin"] and a.get_bytes("runs/x.bin") == b"a"
    assert b.get_bytes("runs/x.bin") == b"b"
    raw = moto_endpoint.client().list_objects_v2(Bucket=s3_bucket)["Contents"]
    assert sorted(o["Key"] for o in raw) == ["team-a/runs/x.bin", "team-b/runs/x.bin"]
    assert "/team-a/runs/x.bin?" in a.presign_get("runs/x.bin", 60)


def test_presigned_put_type_is_the_interface_one(s3_store: S3Store) -> None:
    put = s3_store.presign_put("x", size=0, sha256_hex=hashlib.sha256(b"").hexdigest(), ttl_s=5)
    assert isinstance(put, PresignedPut) and put.expires_in_s == 5
