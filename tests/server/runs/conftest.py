from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "runs" / "arithmetic.json"


def example_config(**overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = json.loads(EXAMPLE.read_text())
    config.update(overrides)
    return config


@pytest.fixture
def runs_app(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    """The app on Postgres or SQLite with a local-folder bucket."""
    from server.app import create_app
    from tests.conftest import make_settings

    application = create_app(make_settings(db_url, tmp_path / "bucket"), migrate=True)
    yield application
    application.state.engine.dispose()


@pytest.fixture
def runs_client(runs_app):  # type: ignore[no-untyped-def]
    from fastapi.testclient import TestClient

    with TestClient(runs_app) as client:
        yield client


@pytest.fixture
def admin(runs_app) -> dict[str, str]:  # type: ignore[no-untyped-def]
    from tests.conftest import mint_token

    return {"Authorization": f"Bearer {mint_token(runs_app, 'admin', name='t')}"}


@pytest.fixture
def db(runs_app) -> Iterator[Session]:  # type: ignore[no-untyped-def]
    """A session on the app's database to arrange and inspect rows. Commit or roll back
    before the next request: on SQLite an open transaction holds the one write lock."""
    session = runs_app.state.sessionmaker()
    yield session
    session.rollback()
    session.close()
