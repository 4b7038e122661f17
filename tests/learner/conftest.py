"""Fixtures of the learner tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.tcp_proxy import TcpProxy
from tests.learner.s3_live import proxied_settings
from tests.live_server import serve_in_thread
from tests.s3_fixtures import S3Endpoint, free_port


@pytest.fixture
def proxy(bucket_proxy: TcpProxy) -> TcpProxy:
    """moto behind a TCP proxy a test can cut (tests/s3_fixtures.py), by the learner tests'
    name."""
    return bucket_proxy


@pytest.fixture
def live_s3(
    pg_url: str, tmp_path: Path, proxy: TcpProxy, moto_endpoint: S3Endpoint, s3_bucket: str
) -> Iterator[tuple[str, Any]]:
    from server.app import create_app

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    settings = proxied_settings(
        pg_url, tmp_path, proxy, moto_endpoint, s3_bucket, learner_lease_ttl_s=30.0
    )
    settings = settings.model_copy(update={"public_url": base, "lease_long_poll_s": 1.0})
    app = create_app(settings, migrate=True)
    with serve_in_thread(app, port):
        yield base, app
