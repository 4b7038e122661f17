"""An app with a short learner lease for the takeover tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import make_settings

# Long enough that a loaded CI machine does not expire a learner mid-step, short enough to wait out.
SHORT_TTL_S = 3.0


@pytest.fixture
def short_app(pg_url: str, tmp_path: Path) -> Iterator[Any]:
    from server.app import create_app

    settings = make_settings(pg_url, tmp_path / "bucket", learner_lease_ttl_s=SHORT_TTL_S)
    application = create_app(settings, migrate=True)
    yield application
    application.state.engine.dispose()


@pytest.fixture
def short_client(short_app: Any) -> Iterator[TestClient]:
    with TestClient(short_app) as test_client:
        yield test_client
