"""One delivery's failure is that delivery's failed attempt, never the end of the pass: a run
whose stored webhook URL the client cannot parse (stored before run creation checked it), or
whose delivery raises something that is no httpx error, does not hold back another run's
webhook. The real delivery job (server/jobs/runner.py) runs on Postgres and SQLite against a
real local receiver."""

from __future__ import annotations

import base64
import json
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from server.db import make_engine, make_sessionmaker, transaction
from server.db_types import db_now
from server.events.service import raise_event
from server.jobs.runner import JobContext, run_job
from server.models import WebhookDelivery
from tests.conftest import make_settings
from tests.server.jobs.factories import new_run
from tests.server.jobs.receiver import Receiver, webhook_receiver


@pytest.fixture
def factory(db_url: str) -> Iterator[sessionmaker[Session]]:
    from server.migrate import upgrade

    engine = make_engine(db_url)
    if db_url.startswith("sqlite"):
        upgrade(engine)
    yield make_sessionmaker(engine)
    engine.dispose()


def _job(factory: sessionmaker[Session], db_url: str, tmp_path: Path) -> JobContext:
    """The delivery job as the scheduler runs it, allowed to reach the loopback receiver. Its
    first retry is an hour away, so that a failed attempt's retry is still in the future when
    the test reads it, however slow the pass was (2 s, the default, passed under load)."""
    settings = make_settings(
        db_url,
        tmp_path / "bucket",
        outbound_allow_private=True,
        jobs={"mode": "celery", "webhook_backoff_s": 3600.0},
    )

    def no_store() -> Any:
        raise AssertionError("the webhooks job needs no bucket")

    return JobContext(settings=settings, factory=factory, store_factory=no_store)


def _alarm(factory: sessionmaker[Session], url: str) -> uuid.UUID:
    """A run whose webhook is `url` (created through the service, which stores the URL as
    given: as a run created before the URL check was), and one alarm event for it."""
    with transaction(factory) as session:
        run = new_run(session, alarms={"webhook_url": url})
        raise_event(session, kind="alarm.no_version", message="no version", run_id=run.id)
        return run.id


def _delivery(factory: sessionmaker[Session], run_id: uuid.UUID) -> tuple[Any, ...]:
    with transaction(factory) as session:
        d = session.execute(
            select(WebhookDelivery).where(WebhookDelivery.run_id == run_id)
        ).scalar_one()
        later = session.execute(select(d.next_attempt_at > db_now())).scalar_one()
        return d.state, d.attempts, d.last_status, d.last_error, bool(later)


def _received_runs(receiver: Receiver) -> list[str]:
    return [json.loads(body)["run_id"] for _headers, body in receiver.requests]


@pytest.mark.parametrize(
    "host",
    ["0177.0.0.1", "127.000.000.001", "256.256.256.256"],
)
def test_a_poisoned_stored_url_fails_its_delivery_and_the_other_run_is_delivered(
    factory: sessionmaker[Session], db_url: str, tmp_path: Path, host: str
) -> None:
    with webhook_receiver([]) as receiver:
        port = receiver.url.split(":")[2].split("/")[0]
        poisoned = _alarm(factory, f"http://{host}:{port}/hook")  # claimed first (lower id)
        good = _alarm(factory, receiver.url)
        counts = run_job("webhooks", _job(factory, db_url, tmp_path))
        assert _received_runs(receiver) == [str(good)]
    assert counts == {"pending": 1, "delivered": 1}
    assert _delivery(factory, good)[:3] == ("delivered", 1, 200)
    state, attempts, status, error, retry_later = _delivery(factory, poisoned)
    assert (state, attempts, status, retry_later) == ("pending", 1, None, True)
    assert error is not None and error.startswith("invalid URL: ") and host in error


def test_any_exception_in_one_delivery_fails_that_attempt_only(
    factory: sessionmaker[Session], db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Name resolution that raises a RuntimeError (no httpx or OS error) for one host: that
    delivery's attempt fails with the error's name and text, the next one is delivered."""
    real_getaddrinfo = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "hooks.example.com":
            raise RuntimeError("resolver exploded")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    with webhook_receiver([]) as receiver:
        broken = _alarm(factory, "http://hooks.example.com/hook")
        good = _alarm(factory, receiver.url)
        counts = run_job("webhooks", _job(factory, db_url, tmp_path))
        assert _received_runs(receiver) == [str(good)]
    assert counts == {"pending": 1, "delivered": 1}
    state, attempts, _status, error, retry_later = _delivery(factory, broken)
    assert (state, attempts, retry_later) == ("pending", 1, True)
    assert error == "RuntimeError: resolver exploded"


def test_a_url_with_credentials_and_query_is_delivered_with_them(
    db_url: str, tmp_path: Path
) -> None:
    """Created through the API (where answers redact them), the stored URL keeps its
    user:password and query: the delivery sends Basic auth and the query."""
    from fastapi.testclient import TestClient

    from server.app import create_app
    from tests.conftest import mint_token
    from tests.server.runs.conftest import example_config

    settings = make_settings(db_url, tmp_path / "bucket", outbound_allow_private=True)
    app = create_app(settings, migrate=True)
    try:
        admin = {"Authorization": f"Bearer {mint_token(app, 'admin', name='a')}"}
        with webhook_receiver([]) as receiver, TestClient(app) as http:
            url = (
                receiver.url.replace("http://", "http://hook-user:pw-s3cret@")
                + "?token=query-s3cret"
            )
            body = example_config(alarms={"webhook_url": url})
            created = http.post("/api/v1/runs", json=body, headers=admin)
            assert created.status_code == 201, created.text
            # markers no random id or token can hold ("q1" once matched a run token by chance)
            assert "s3cret" not in created.text and "query-" not in created.text
            run_id = uuid.UUID(created.json()["run"]["id"])
            with transaction(app.state.sessionmaker) as session:
                raise_event(session, kind="alarm.no_version", message="m", run_id=run_id)
            ctx = JobContext(settings, app.state.sessionmaker, lambda: app.state.store)
            assert run_job("webhooks", ctx) == {"delivered": 1}
            (headers, _body), path = receiver.requests[0], receiver.paths[0]
    finally:
        app.state.engine.dispose()
    expected = "Basic " + base64.b64encode(b"hook-user:pw-s3cret").decode()
    assert headers["authorization"] == expected
    assert path == "/hook?token=query-s3cret"
