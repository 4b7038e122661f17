"""Webhook delivery: HMAC-SHA256-signed JSON POSTs with retries and exponential backoff.

The receiver verifies `X-AsyncGRPO-Signature: sha256=<hex>` = HMAC-SHA256(secret, raw body)
with the server's secret key (settings.secret_key()). Every delivery and its attempts are kept
in `webhook_deliveries` (the delivery log). Deliveries are claimed with a compare-and-set on
their next attempt time, so two job runners never post the same attempt twice; HTTP happens
outside any database transaction, through the outbound policy (protocol/outbound.py): a
destination it refuses is an attempt that failed with the reason, retried like any other
(a name may resolve elsewhere later). Any error of one delivery (a URL the client cannot use,
stored before creation checked it; any exception) is that attempt failing with its reason: it
never stops the pass, so one run's bad URL cannot hold back another run's alerts.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from dataclasses import dataclass
from typing import Any

import httpx
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from protocol.outbound import (
    PUBLIC_ONLY,
    OutboundPolicy,
    OutboundRefused,
    client,
    normalised_url,
    redacted_url,
)
from server.db import is_postgres, transaction
from server.db_types import db_now, db_now_plus
from server.models import Event, WebhookDelivery

log = logging.getLogger("asyncgrpo.events.webhooks")

SIGNATURE_HEADER = "X-AsyncGRPO-Signature"
CLAIM_S = 120.0


def sign(secret: str, body: bytes) -> str:
    """The signature header's value for a raw body."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify(secret: str, body: bytes, header: str) -> bool:
    """Constant-time check of a signature header (what a receiver does)."""
    return hmac.compare_digest(sign(secret, body), header)


def payload_of(event: Event) -> dict[str, Any]:
    return {
        "event_id": event.id,
        "kind": event.kind,
        "severity": event.severity,
        "message": event.message,
        "run_id": str(event.run_id) if event.run_id else None,
        "worker_id": str(event.worker_id) if event.worker_id else None,
        "data": event.data,
        "created_at": event.created_at.isoformat() if event.created_at else None,
    }


def enqueue(session: Session, event: Event, url: str) -> WebhookDelivery:
    """Queue a delivery of `event` to `url` (sent by the next delivery pass)."""
    session.refresh(event)
    delivery = WebhookDelivery(
        run_id=event.run_id,
        event_id=event.id,
        url=url,
        payload=payload_of(event),
        state="pending",
        next_attempt_at=db_now(),
    )
    session.add(delivery)
    session.flush()
    return delivery


@dataclass(frozen=True)
class Claimed:
    id: int
    url: str
    payload: dict[str, Any]
    attempts: int


def claim_due(session: Session, limit: int = 50) -> list[Claimed]:
    """Pending deliveries whose next attempt is due, pushed CLAIM_S ahead so no other runner
    takes them while this one posts."""
    stmt = (
        select(WebhookDelivery.id)
        .where(WebhookDelivery.state == "pending", WebhookDelivery.next_attempt_at <= db_now())
        .order_by(WebhookDelivery.id)
        .limit(limit)
    )
    if is_postgres(session):
        stmt = stmt.with_for_update(skip_locked=True)
    ids = list(session.execute(stmt).scalars())
    if not ids:
        return []
    rows = session.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.id.in_(ids), WebhookDelivery.state == "pending")
        .values(next_attempt_at=db_now_plus(CLAIM_S))
        .returning(
            WebhookDelivery.id,
            WebhookDelivery.url,
            WebhookDelivery.payload,
            WebhookDelivery.attempts,
        )
        .execution_options(synchronize_session=False)
    ).all()
    return [Claimed(r.id, r.url, r.payload, r.attempts) for r in rows]


def record(
    session: Session,
    claimed: Claimed,
    *,
    status: int | None,
    error: str | None,
    max_attempts: int,
    backoff_s: float,
) -> str:
    """Store one attempt's outcome; returns the delivery's new state."""
    attempts = claimed.attempts + 1
    ok = status is not None and 200 <= status < 300
    values: dict[str, Any]
    if ok:
        state, values = "delivered", {"delivered_at": db_now()}
    elif attempts >= max_attempts:
        state, values = "failed", {}
    else:
        delay = backoff_s * 2 ** (attempts - 1)
        state, values = "pending", {"next_attempt_at": db_now_plus(delay)}
    session.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.id == claimed.id)
        .values(state=state, attempts=attempts, last_status=status, last_error=error, **values)
        .execution_options(synchronize_session=False)
    )
    return state


def post(
    url: str,
    payload: dict[str, Any],
    secret: str,
    timeout_s: float,
    policy: OutboundPolicy = PUBLIC_ONLY,
) -> tuple[int | None, str | None]:
    """POST the signed JSON body through `policy`; returns (status, error). Never raises: any
    failure (httpx.InvalidURL is not an httpx.HTTPError) is this attempt's error."""
    try:
        checked = normalised_url(url)  # a URL stored before run creation checked it
    except ValueError as exc:
        return None, f"invalid URL: {exc}"[:500]
    try:
        return _post(checked, payload, secret, timeout_s, policy)
    except OutboundRefused as exc:
        return None, f"outbound policy: {exc}"[:500]
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}"[:500]
    except Exception as exc:
        log.warning("webhook POST to %s raised", redacted_url(url), exc_info=True)
        return None, f"{type(exc).__name__}: {exc}"[:500]


def _post(
    url: str, payload: dict[str, Any], secret: str, timeout_s: float, policy: OutboundPolicy
) -> tuple[int, str | None]:
    body = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    headers = {
        "Content-Type": "application/json",
        SIGNATURE_HEADER: sign(secret, body),
        "X-AsyncGRPO-Event": str(payload.get("kind", "")),
        "User-Agent": "asyncgrpo-webhooks/1",
    }
    with client(policy, timeout_s=timeout_s) as http:
        response = http.post(url, content=body, headers=headers)
        error = None if response.is_success else response.text[:500]
    return response.status_code, error


def deliver_due(
    factory: sessionmaker[Session],
    *,
    secret: str,
    max_attempts: int = 8,
    backoff_s: float = 2.0,
    timeout_s: float = 10.0,
    policy: OutboundPolicy = PUBLIC_ONLY,
) -> dict[str, int]:
    """One delivery pass: claim what is due, POST each (through `policy`), record each
    outcome. Returns counts by resulting state."""
    with transaction(factory) as session:
        claimed = claim_due(session)
    counts: dict[str, int] = {}
    for item in claimed:
        status, error = post(item.url, item.payload, secret, timeout_s, policy)
        with transaction(factory) as session:
            state = record(
                session,
                item,
                status=status,
                error=error,
                max_attempts=max_attempts,
                backoff_s=backoff_s,
            )
        counts[state] = counts.get(state, 0) + 1
        if state != "delivered":
            log.warning("webhook %s to %s: %s %s", item.id, redacted_url(item.url), status, error)
    return counts
