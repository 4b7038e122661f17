"""Fixtures of the learner tests: moto S3 behind a TCP proxy that a test can cut."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.tcp_proxy import TcpProxy
from tests.s3_fixtures import S3Endpoint, free_port


@pytest.fixture
def proxy(moto_endpoint: S3Endpoint) -> Iterator[TcpProxy]:
    """A TCP proxy in front of moto: `cut()` refuses and resets, `restore()` listens again."""
    host, port = moto_endpoint.url.removeprefix("http://").split(":")
    tcp = TcpProxy(host, int(port), free_port()).start()
    yield tcp
    tcp.stop()
