"""The version long-poll's tests run on the lease tests' two databases (`lease_path`: postgres
and sqlite; the watch reads through a session in a thread on both), each on a real server
(uvicorn in a thread) so that a long-poll and a publish can overlap."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from tests.harness.serve import serve_in_thread
from tests.s3_fixtures import free_port
from tests.server.leases.conftest import (  # noqa: F401 - the lease tests' database fixtures
    emptied_lease_pg_database,
    lease_path,
    lease_pg_database,
)
from tests.server.leases.lease_paths import LeasePath

LONG_POLL_S = 10.0


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def versions_app(lease_path: LeasePath, tmp_path: Path, port: int) -> FastAPI:  # noqa: F811
    """The app, its signed blob URLs pointing at the port it will be served on (the learner
    uploads through them)."""
    from server.app import create_app

    settings = lease_path.settings(tmp_path / "bucket", lease_long_poll_s=LONG_POLL_S)
    served = settings.model_copy(update={"public_url": f"http://127.0.0.1:{port}"})
    return create_app(served, migrate=True)


@pytest.fixture
def base_url(versions_app: FastAPI, port: int) -> Iterator[str]:
    with serve_in_thread(versions_app, port) as url:
        yield url


@pytest.fixture
def http(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=60) as client:
        yield client
