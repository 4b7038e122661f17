"""Webhook deliveries go through the outbound policy (protocol/outbound.py): a destination it
refuses is a failed attempt with the reason in the delivery log, nothing sent; a loopback
literal is refused when the run is created."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from protocol.outbound import OutboundPolicy
from server.db import make_engine, make_sessionmaker, transaction
from server.events import webhooks
from server.jobs.alarms import evaluate_alarms
from server.models import WebhookDelivery
from tests.conftest import TEST_SECRET, make_settings, mint_token
from tests.server.jobs.factories import new_run
from tests.server.jobs.receiver import webhook_receiver
from tests.server.runs.conftest import example_config


def _queue_alarm(factory: sessionmaker[Session], url: str) -> Any:
    with transaction(factory) as session:
        run = new_run(session, alarms={"no_version_minutes": 0.001, "webhook_url": url})
        time.sleep(0.1)
        assert ("no_version", "fired") in evaluate_alarms(session)
    return run.id


def _delivery(factory: sessionmaker[Session], run_id: Any) -> WebhookDelivery:
    with transaction(factory) as session:
        return session.execute(
            select(WebhookDelivery).where(WebhookDelivery.run_id == run_id)
        ).scalar_one()


def test_a_webhook_to_loopback_is_refused_and_recorded(pg_url: str) -> None:
    engine = make_engine(pg_url)
    factory = make_sessionmaker(engine)
    try:
        with webhook_receiver([]) as receiver:
            run_id = _queue_alarm(factory, receiver.url)
            counts = webhooks.deliver_due(factory, secret=TEST_SECRET, max_attempts=1)
            refused = _delivery(factory, run_id)
            assert receiver.requests == []  # nothing was sent
    finally:
        engine.dispose()
    assert counts == {"failed": 1}
    assert refused.state == "failed" and refused.attempts == 1 and refused.last_status is None
    assert refused.last_error is not None
    assert refused.last_error.startswith("outbound policy: refused '127.0.0.1'")
    assert "ASYNCGRPO_OUTBOUND_ALLOW_PRIVATE" in refused.last_error


def test_the_setting_lets_a_webhook_reach_loopback(pg_url: str) -> None:
    engine = make_engine(pg_url)
    factory = make_sessionmaker(engine)
    settings = make_settings(pg_url, Path("unused"), outbound_allow_private=True)
    try:
        with webhook_receiver([]) as receiver:
            run_id = _queue_alarm(factory, receiver.url)
            counts = webhooks.deliver_due(
                factory, secret=TEST_SECRET, max_attempts=1, policy=settings.outbound_policy()
            )
            delivered = _delivery(factory, run_id)
            assert len(receiver.requests) == 1
    finally:
        engine.dispose()
    assert counts == {"delivered": 1} and delivered.last_status == 200


def test_a_name_resolving_to_a_private_address_is_refused_at_send_time(pg_url: str) -> None:
    """hooks.example.com passes registration (a name); what it resolves to when the delivery
    is sent is refused (a stand-in DNS answers 10.0.0.5), and the attempt is retried later."""
    engine = make_engine(pg_url)
    factory = make_sessionmaker(engine)
    policy = OutboundPolicy(resolver=lambda host, port: ["10.0.0.5"])
    try:
        run_id = _queue_alarm(factory, "http://hooks.example.com/hook")
        counts = webhooks.deliver_due(
            factory, secret=TEST_SECRET, max_attempts=3, backoff_s=60, policy=policy
        )
        pending = _delivery(factory, run_id)
    finally:
        engine.dispose()
    assert counts == {"pending": 1}
    assert pending.state == "pending" and pending.attempts == 1
    assert pending.last_error is not None and "'hooks.example.com': 10.0.0.5" in pending.last_error


def _create(app: Any, url: str) -> Any:
    token = mint_token(app, "admin", name="admin")
    body = example_config(alarms={"webhook_url": url})
    with TestClient(app) as http:
        return http.post("/api/v1/runs", json=body, headers={"Authorization": f"Bearer {token}"})


def test_a_loopback_webhook_literal_is_refused_at_run_creation(pg_url: str, tmp_path: Path) -> None:
    from server.app import create_app

    app = create_app(make_settings(pg_url, tmp_path / "bucket"), migrate=True)
    try:
        for url in ("http://127.0.0.1:9/hook", "http://[::1]/hook", "http://169.254.169.254/"):
            refused = _create(app, url)
            assert refused.status_code == 422, refused.text
            body = json.loads(refused.text)
            assert body["field"] == "alarms.webhook_url" and "refused" in body["detail"]
        assert _create(app, "https://hooks.example.com/hook").status_code == 201
    finally:
        app.state.engine.dispose()
    allowed = create_app(
        make_settings(pg_url, tmp_path / "bucket", outbound_allow_private=True), migrate=True
    )
    try:
        assert _create(allowed, "http://127.0.0.1:9/hook").status_code == 201
    finally:
        allowed.state.engine.dispose()
