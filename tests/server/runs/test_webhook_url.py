"""Issue 25: a run's webhook URL is parsed and normalised at creation as the delivery client
(httpx) parses it; one the client cannot use, or an IP literal in a non-canonical form, is a
422 naming `alarms.webhook_url`; canonical literals then meet the outbound policy. Credentials
and the query in the URL are never shown (API answers, the learner's attach, pages) and are
kept for delivery. On Postgres and SQLite."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from server.db import transaction
from server.models import Run
from tests.server.dashboard.test_pages import login
from tests.server.learner.support import RunHandle, attach
from tests.server.runs.conftest import example_config

SECRET_URL = "https://hook-user:pw-s3cret@hooks.example.com/hook?token=q-s3cret"
SHOWN_URL = "https://redacted@hooks.example.com/hook?redacted"


def _create(client: TestClient, admin: dict[str, str], url: str) -> Any:
    body = example_config(alarms={"webhook_url": url})
    return client.post("/api/v1/runs", json=body, headers=admin)


def _no_runs(client: TestClient, admin: dict[str, str]) -> bool:
    return client.get("/api/v1/runs", headers=admin).json() == []


@pytest.mark.parametrize(
    "host",
    [
        "0177.0.0.1",  # octal
        "127.000.000.001",  # zero-padded
        "256.256.256.256",  # out of range
        "0x7f.1",  # hexadecimal, short
        "0x7f000001",  # hexadecimal integer
        "127.1",  # short
        "2130706433",  # integer
        "127.0.0.1.",  # trailing dot
        "1.2.3.4.5",  # five parts
    ],
)
def test_a_non_canonical_ip_literal_is_refused_at_creation(
    runs_client: TestClient, admin: dict[str, str], host: str
) -> None:
    refused = _create(runs_client, admin, f"http://{host}:8080/hook")
    assert refused.status_code == 422, refused.text
    body = refused.json()
    assert body["field"] == "alarms.webhook_url"
    assert body["code"] == "webhook_url_invalid"
    assert f"host {host!r} is not a canonical IPv4 address" in body["detail"]
    assert _no_runs(runs_client, admin)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://exa mple.com/hook", "is not a host name"),
        ("http://hooks.example.com:99999/hook", "port 99999 is not in 1-65535"),
        ("http://a..b/hook", "is not a host name"),
    ],
)
def test_a_url_the_client_cannot_use_is_refused_at_creation(
    runs_client: TestClient, admin: dict[str, str], url: str, reason: str
) -> None:
    refused = _create(runs_client, admin, url)
    assert refused.status_code == 422, refused.text
    body = refused.json()
    assert (body["field"], body["code"]) == ("alarms.webhook_url", "webhook_url_invalid")
    assert reason in body["detail"]
    assert _no_runs(runs_client, admin)


def test_a_canonical_loopback_literal_meets_the_outbound_policy(
    runs_client: TestClient, admin: dict[str, str]
) -> None:
    for url in (
        "http://127.0.0.1:9/hook",
        "http://[::ffff:7f00:1]/hook",
        "http://[::ffff:127.0.0.1]/",
    ):
        refused = _create(runs_client, admin, url)
        assert refused.status_code == 422, refused.text
        body = refused.json()
        assert (body["field"], body["code"]) == ("alarms.webhook_url", "webhook_url_refused")
    assert _no_runs(runs_client, admin)


def test_the_url_is_stored_as_the_client_sends_it(
    runs_app: Any, runs_client: TestClient, admin: dict[str, str]
) -> None:
    created = _create(runs_client, admin, "HTTPS://Hooks.Example.COM:443/a b#frag")
    assert created.status_code == 201, created.text
    run_id = created.json()["run"]["id"]
    shown = runs_client.get(f"/api/v1/runs/{run_id}", headers=admin).json()
    assert shown["config"]["alarms"]["webhook_url"] == "https://hooks.example.com/a%20b"
    assert _stored_url(runs_app, run_id) == "https://hooks.example.com/a%20b"


def _stored_url(app: Any, run_id: str) -> str:
    with transaction(app.state.sessionmaker) as session:
        config = session.execute(select(Run.config).where(Run.id == uuid.UUID(run_id)))
        return str(config.scalar_one()["alarms"]["webhook_url"])


def test_credentials_and_query_are_redacted_in_every_answer_and_kept_for_delivery(
    runs_app: Any, runs_client: TestClient, admin: dict[str, str], admin_token_of: str
) -> None:
    created = _create(runs_client, admin, SECRET_URL)
    assert created.status_code == 201, created.text
    run = created.json()["run"]
    assert run["config"]["alarms"]["webhook_url"] == SHOWN_URL
    handle = RunHandle(uuid.UUID(run["id"]), created.json()["learner_token"])
    answers = {
        "create": created.text,
        "get": runs_client.get(f"/api/v1/runs/{run['id']}", headers=admin).text,
        "list": runs_client.get("/api/v1/runs", headers=admin).text,
        "attach": str(attach(runs_client, handle)["run_config"]),
    }
    login(runs_client, admin_token_of)
    for name, path in (
        ("run page", f"/runs/{run['id']}"),
        ("runs page", "/"),
        ("live", f"/runs/{run['id']}/live"),
    ):
        page = runs_client.get(path)
        assert page.status_code == 200 and run["id"] in page.text, name
        answers[name] = page.text
    for where, text in answers.items():
        assert "s3cret" not in text and "hook-user" not in text, where
    assert SHOWN_URL in answers["get"] and "redacted" in answers["attach"]
    assert _stored_url(runs_app, run["id"]) == SECRET_URL  # what deliveries use


@pytest.fixture
def admin_token_of(runs_app: Any) -> str:
    from tests.conftest import mint_token

    return mint_token(runs_app, "admin", name="dash")
