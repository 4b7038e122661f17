"""S3-compatible object store through boto3 (AWS S3, MinIO, R2, Hugging Face buckets).

SigV4 everywhere (`signature_version="s3v4"`). Large files go up as a multipart upload whose
parts run in a small thread pool; a no-overwrite put sends `If-None-Match: *` on the PutObject
or on the CompleteMultipartUpload, and the store's 412 becomes ObjectExists. Presigned PUTs sign
Content-Length, x-amz-checksum-sha256 and (when asked) If-None-Match, so S3 refuses any other
body; PresignedPut.headers are exactly the signed headers the client must send.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
from boto3.exceptions import Boto3Error
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from protocol.storage import (
    BucketMissing,
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    PresignedPut,
    StoreError,
    sha256_b64,
    validate_key,
    validate_prefix,
)

MIB = 1024 * 1024
MAX_PRESIGN_TTL_S = 7 * 24 * 3600  # SigV4's limit


class S3Store(ObjectStore):
    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str = "us-east-1",
        path_style: bool = False,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        *,
        multipart_threshold: int = 16 * MIB,
        part_size: int = 8 * MIB,
        max_concurrency: int = 4,
    ) -> None:
        if part_size < 5 * MIB:
            raise ValueError("S3 parts must be at least 5 MiB")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        if self.prefix:
            validate_key(self.prefix)
        self.multipart_threshold = max(multipart_threshold, part_size)
        self.part_size = part_size
        self.max_concurrency = max_concurrency
        config = Config(
            signature_version="s3v4",
            s3={"addressing_style": "path" if path_style else "virtual"},
            retries={"max_attempts": 5, "mode": "standard"},
            max_pool_connections=max(10, 2 * max_concurrency),
        )
        self.client: Any = boto3.client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=region,
            aws_access_key_id=access_key_id,
            aws_secret_access_key=secret_access_key,
            config=config,
        )

    def _full(self, key: str) -> str:
        validate_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    # -- puts ----------------------------------------------------------------------------------

    def put_bytes(self, key: str, data: bytes, *, if_none_match: bool = False) -> ObjectInfo:
        extra: dict[str, str] = {"IfNoneMatch": "*"} if if_none_match else {}
        checksum = sha256_b64(hashlib.sha256(data).hexdigest())
        with _translate(key):
            self.client.put_object(
                Bucket=self.bucket, Key=self._full(key), Body=data, ChecksumSHA256=checksum, **extra
            )
        return ObjectInfo(key=key, size=len(data))

    def put_file(self, key: str, path: Path, *, if_none_match: bool = False) -> ObjectInfo:
        full = self._full(key)
        size = os.path.getsize(path)
        if size < self.multipart_threshold:
            return self.put_bytes(key, Path(path).read_bytes(), if_none_match=if_none_match)
        with _translate(key):
            upload_id = self.client.create_multipart_upload(Bucket=self.bucket, Key=full)[
                "UploadId"
            ]
        try:
            with _translate(key):  # a part's 5xx after its retries: a StoreError too
                parts = self._upload_parts(full, upload_id, Path(path), size)
            extra: dict[str, str] = {"IfNoneMatch": "*"} if if_none_match else {}
            with _translate(key):
                self.client.complete_multipart_upload(
                    Bucket=self.bucket,
                    Key=full,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                    **extra,
                )
        except BaseException:
            self._abort(full, upload_id)
            raise
        return ObjectInfo(key=key, size=size)

    def _upload_parts(
        self, full: str, upload_id: str, path: Path, size: int
    ) -> list[dict[str, Any]]:
        offsets = list(range(0, size, self.part_size))

        def one(number: int, offset: int) -> dict[str, Any]:
            with open(path, "rb") as f:
                f.seek(offset)
                body = f.read(self.part_size)
            response = self.client.upload_part(
                Bucket=self.bucket,
                Key=full,
                UploadId=upload_id,
                PartNumber=number,
                Body=body,
            )
            return {"ETag": response["ETag"], "PartNumber": number}

        with ThreadPoolExecutor(max_workers=self.max_concurrency) as pool:
            futures = [pool.submit(one, i + 1, off) for i, off in enumerate(offsets)]
            return [f.result() for f in futures]

    def _abort(self, full: str, upload_id: str) -> None:
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload_id)
        except ClientError:
            pass

    # -- the bucket ----------------------------------------------------------------------------

    def bucket_exists(self) -> bool:
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            if _status(exc) == 404:
                return False
            raise StoreError(f"bucket {self.bucket!r}: {exc}") from exc
        except BotoCoreError as exc:  # the endpoint cannot be reached
            raise StoreError(f"bucket {self.bucket!r}: {exc}") from exc
        return True

    def create_bucket(self) -> None:
        region = self.client.meta.region_name
        # us-east-1 is S3's default location and refuses to be named as a constraint
        where = {} if region in (None, "us-east-1") else {"LocationConstraint": region}
        try:
            self.client.create_bucket(
                Bucket=self.bucket, **({"CreateBucketConfiguration": where} if where else {})
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "BucketAlreadyOwnedByYou":
                return
            raise StoreError(f"cannot create the bucket {self.bucket!r}: {exc}") from exc
        except BotoCoreError as exc:
            raise StoreError(f"cannot create the bucket {self.bucket!r}: {exc}") from exc

    # -- reads ---------------------------------------------------------------------------------

    def get_bytes(self, key: str) -> bytes:
        with _translate(key):
            response = self.client.get_object(Bucket=self.bucket, Key=self._full(key))
        data: bytes = response["Body"].read()
        return data

    def download_file(self, key: str, path: Path) -> None:
        path = Path(path)
        tmp = path.with_name(path.name + ".part")
        with _translate(key):
            self.client.download_file(self.bucket, self._full(key), str(tmp))
        os.replace(tmp, path)

    def head(self, key: str) -> ObjectInfo | None:
        try:
            response = self.client.head_object(Bucket=self.bucket, Key=self._full(key))
        except ClientError as exc:
            if _status(exc) == 404:
                return None
            raise StoreError(f"head {key!r}: {exc}") from exc
        return ObjectInfo(key=key, size=int(response["ContentLength"]))

    def sha256(self, key: str) -> str | None:
        try:
            response = self.client.head_object(
                Bucket=self.bucket, Key=self._full(key), ChecksumMode="ENABLED"
            )
        except ClientError as exc:
            if _status(exc) == 404:
                return None
            raise StoreError(f"head {key!r}: {exc}") from exc
        checksum = response.get("ChecksumSHA256")
        if not checksum or "-" in checksum:  # absent, or a multipart checksum of checksums
            return None
        return base64.b64decode(checksum).hex()

    def delete(self, key: str) -> None:
        with _translate(key):
            self.client.delete_object(Bucket=self.bucket, Key=self._full(key))

    def list(self, prefix: str) -> list[str]:
        validate_prefix(prefix)
        full = f"{self.prefix}/{prefix}" if self.prefix else prefix
        strip = len(self.prefix) + 1 if self.prefix else 0
        keys: list[str] = []
        paginator = self.client.get_paginator("list_objects_v2")
        with _translate(prefix):
            for page in paginator.paginate(Bucket=self.bucket, Prefix=full):
                keys.extend(obj["Key"][strip:] for obj in page.get("Contents", []))
        return sorted(keys)

    # -- presigned URLs ------------------------------------------------------------------------

    def presign_get(self, key: str, ttl_s: int) -> str:
        url: str = self.client.generate_presigned_url(
            "get_object",
            Params={"Bucket": self.bucket, "Key": self._full(key)},
            ExpiresIn=_ttl(ttl_s),
        )
        return url

    def presign_put(
        self, key: str, *, size: int, sha256_hex: str, ttl_s: int, if_none_match: bool = False
    ) -> PresignedPut:
        if size < 0:
            raise ValueError("size must be >= 0")
        checksum = sha256_b64(sha256_hex)
        params: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": self._full(key),
            "ContentLength": size,
            "ChecksumSHA256": checksum,
        }
        headers = {"Content-Length": str(size), "x-amz-checksum-sha256": checksum}
        if if_none_match:
            params["IfNoneMatch"] = "*"
            headers["If-None-Match"] = "*"
        url: str = self.client.generate_presigned_url(
            "put_object", Params=params, ExpiresIn=_ttl(ttl_s)
        )
        return PresignedPut(url=url, headers=headers, expires_in_s=ttl_s)


def _ttl(ttl_s: int) -> int:
    if not 0 < ttl_s <= MAX_PRESIGN_TTL_S:
        raise ValueError(f"ttl_s must be in 1..{MAX_PRESIGN_TTL_S}")
    return int(ttl_s)


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


@contextmanager
def _translate(key: str) -> Iterator[None]:
    """Map S3's answers to the store's exceptions: 412 -> ObjectExists, 404 -> ObjectNotFound."""
    try:
        yield
    except ClientError as exc:
        status = _status(exc)
        code = exc.response.get("Error", {}).get("Code", "")
        if status == 412 or code == "PreconditionFailed":
            raise ObjectExists(key) from exc
        if code == "NoSuchBucket":  # not a missing object: every key is unreachable
            raise BucketMissing(f"the bucket does not exist (key {key!r})") from exc
        if status == 404 or code in ("NoSuchKey", "404"):
            raise ObjectNotFound(key) from exc
        raise StoreError(f"{code or status} on {key!r}: {exc}") from exc
    except Boto3Error as exc:  # a transfer's retries exhausted (a body cut short every try)
        raise StoreError(f"{type(exc).__name__} on {key!r}: {exc}") from exc
