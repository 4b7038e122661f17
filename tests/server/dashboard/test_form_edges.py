"""Dashboard forms refuse what Postgres text cannot hold (U+0000) and what jsonb cannot hold
(NaN) with a field error, on both databases (issue 17 item 10)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from server.db import transaction
from server.models import Run, Token
from tests.conftest import make_settings
from tests.server.dashboard.test_pages import login


@pytest.fixture
def settings(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    return make_settings(db_url, tmp_path / "bucket")


def _form(**fields: str) -> dict[str, str]:
    base = {"name": "edge-run", "base_model": "smollm2-135m-instruct", "rewards": "numeric_match"}
    base.update(fields)
    return base


def _nothing_created(app) -> bool:  # type: ignore[no-untyped-def]
    with transaction(app.state.sessionmaker) as session:
        return session.execute(select(Run)).first() is None


@pytest.mark.parametrize("field", ["name", "base_model"])
def test_nul_in_a_new_run_field_is_an_error_on_that_field(
    client: TestClient, app, admin_token: str, field: str
) -> None:  # type: ignore[no-untyped-def]
    csrf = login(client, admin_token)
    r = client.post("/runs/new", data={**_form(**{field: "a\x00b"}), "csrf_token": csrf})
    assert r.status_code == 422, r.text
    assert re.search(rf'data-error-for="{field}">[^<]*NUL', r.text)
    assert _nothing_created(app)


@pytest.mark.parametrize(
    "jsonl",
    [
        b'{"prompt": "p\x00", "answer": "1"}\n',
        b'{"prompt": "p", "answer": "1\\u0000"}\n',
        b'{"prompt": "p", "answer": NaN}\n',
        b'{"prompt": "p", "answer": [Infinity]}\n',
    ],
)
def test_unstorable_jsonl_is_reported_next_to_the_file(
    client: TestClient, app, admin_token: str, jsonl: bytes
) -> None:  # type: ignore[no-untyped-def]
    csrf = login(client, admin_token)
    r = client.post(
        "/runs/new",
        data={**_form(**{"dataset.kind": "jsonl"}), "csrf_token": csrf},
        files={"dataset.file": ("rows.jsonl", jsonl, "application/json")},
    )
    assert r.status_code == 422, r.text
    assert re.search(r'data-error-for="dataset.file">[^<]*(NUL|finite|control)', r.text), r.text
    assert _nothing_created(app)


def test_nul_in_a_registration_token_name_is_422(client: TestClient, app, admin_token: str) -> None:  # type: ignore[no-untyped-def]
    csrf = login(client, admin_token)
    r = client.post("/workers/registration-tokens", data={"name": "pool\x00", "csrf_token": csrf})
    assert r.status_code == 422, r.text
    with transaction(app.state.sessionmaker) as session:
        kinds = session.execute(select(Token.kind)).scalars().all()
    assert "registration" not in kinds


@pytest.mark.parametrize("host", ["0177.0.0.1", "127.1", "2130706433"])
def test_a_non_canonical_webhook_host_is_an_error_on_that_field(
    client: TestClient, app, admin_token: str, host: str
) -> None:  # type: ignore[no-untyped-def]
    """Issue 25: the form takes the API's URL rule (one home: server/runs/service.py)."""
    csrf = login(client, admin_token)
    url = f"http://{host}:8080/hook"
    r = client.post("/runs/new", data={**_form(**{"alarms.webhook_url": url}), "csrf_token": csrf})
    assert r.status_code == 422, r.text
    assert re.search(r'data-error-for="alarms\.webhook_url">[^<]*not a canonical IPv4', r.text)
    assert _nothing_created(app)
