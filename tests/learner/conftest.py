"""Fixtures of the learner tests."""

from __future__ import annotations

import pytest

from tests.e2e.tcp_proxy import TcpProxy


@pytest.fixture
def proxy(bucket_proxy: TcpProxy) -> TcpProxy:
    """moto behind a TCP proxy a test can cut (tests/s3_fixtures.py), by the learner tests'
    name."""
    return bucket_proxy
