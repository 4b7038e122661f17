"""moto S3 server fixtures (owned by the object-store work).

One real S3 protocol server (moto's ThreadedMotoServer) on 127.0.0.1 and a free port per test
session, and a fresh bucket per test. moto enforces IfNoneMatch (412, also on presigned PUTs and
CompleteMultipartUpload) but not presigned-URL expiry nor a signed ChecksumSHA256 (moto 5).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import pytest

from asyncgrpo.cluster import free_port
from tests.e2e.tcp_proxy import TcpProxy
from tests.harness.s3 import S3Endpoint

__all__ = ["S3Endpoint", "free_port"]  # re-exported: tests import them from here


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[S3Endpoint]:
    """moto's S3 server on 127.0.0.1:<free port> for the whole session."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield S3Endpoint(url=f"http://127.0.0.1:{port}")
    server.stop()


@pytest.fixture
def s3_bucket(moto_endpoint: S3Endpoint) -> str:
    """A fresh, empty bucket for this test."""
    name = f"test-{uuid.uuid4().hex[:16]}"
    moto_endpoint.client().create_bucket(Bucket=name)
    return name


@pytest.fixture
def s3_store(moto_endpoint: S3Endpoint, s3_bucket: str):  # type: ignore[no-untyped-def]
    """An S3Store on this test's bucket, configured as settings would (path-style, static keys)."""
    from protocol.storage_s3 import S3Store

    return S3Store(
        bucket=s3_bucket,
        prefix="",
        endpoint_url=moto_endpoint.url,
        region=moto_endpoint.region,
        path_style=True,
        access_key_id=moto_endpoint.access_key_id,
        secret_access_key=moto_endpoint.secret_access_key,
    )


@pytest.fixture
def bucket_proxy(moto_endpoint: S3Endpoint) -> Iterator[TcpProxy]:
    """A TCP proxy in front of moto: `cut()` refuses and resets, `restore()` listens again
    (moto's objects live in its process, so an outage is cut here, never by killing moto)."""
    host, port = moto_endpoint.url.removeprefix("http://").split(":")
    proxy = TcpProxy(host, int(port), free_port()).start()
    yield proxy
    proxy.stop()
