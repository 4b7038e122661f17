"""A body over the limit is 413 whether it declares its length or streams it chunked."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.conftest import make_settings, mint_token

LIMIT = 4096


@pytest.fixture
def small_client(sqlite_url: str, tmp_path: Path) -> Iterator[tuple[TestClient, str]]:
    from server.app import create_app

    settings = make_settings(sqlite_url, tmp_path / "bucket")
    settings.security.max_body_bytes = LIMIT
    app = create_app(settings, migrate=True)
    with TestClient(app) as client:
        yield client, mint_token(app, "admin", name="t")
    app.state.engine.dispose()


def _chunks(total: int, size: int = 1000) -> Iterator[bytes]:
    yield b'{"name": "'
    for _ in range(total // size):
        yield b"x" * size
    yield b'"}'


@pytest.mark.parametrize("chunked", [False, True])
def test_oversized_body_is_413_sized_or_chunked(
    small_client: tuple[TestClient, str], chunked: bool
) -> None:
    client, admin = small_client
    body = b"".join(_chunks(LIMIT * 3))
    response = client.post(
        "/api/v1/registration-tokens",
        content=_chunks(LIMIT * 3) if chunked else body,
        headers={"Authorization": f"Bearer {admin}", "Content-Type": "application/json"},
    )
    assert response.status_code == 413, response.text
    assert f"over {LIMIT} bytes" in response.json()["detail"]
    assert response.json()["code"] == "body_too_large"


def test_a_chunked_body_under_the_limit_passes(small_client: tuple[TestClient, str]) -> None:
    client, admin = small_client
    response = client.post(
        "/api/v1/registration-tokens",
        content=iter([b'{"name": ', b'"ok"}']),
        headers={"Authorization": f"Bearer {admin}", "Content-Type": "application/json"},
    )
    assert response.status_code == 201, response.text
