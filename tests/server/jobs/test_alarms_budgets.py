"""Alarms (once per crossing), budgets and webhook delivery, run as plain job functions on a
fresh Postgres database."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from protocol.outbound import OutboundPolicy
from server.db import make_engine, make_sessionmaker, transaction
from server.db_types import db_now
from server.events import webhooks
from server.jobs.alarms import evaluate_alarms
from server.jobs.budgets import enforce_budgets
from server.models import Event, Lease, MetricPoint, Run, WebhookDelivery, Worker
from server.storage_factory import make_store
from tests.conftest import TEST_SECRET, make_settings
from tests.server.jobs.factories import acquire, add_batch, new_run, new_worker
from tests.server.jobs.receiver import webhook_receiver


def _events(session: Session, run_id: object, kind: str) -> int:
    return int(
        session.execute(
            select(func.count()).where(Event.run_id == run_id, Event.kind == kind)
        ).scalar_one()
    )


def test_stale_waste_alarm_fires_once_per_crossing_and_rearms(
    db_session: Session, pg_url: str, tmp_path: Path
) -> None:
    settings = make_settings(pg_url, tmp_path / "bucket")
    store = make_store(settings)
    run = new_run(db_session, n_rows=10, alarms={"stale_waste": 0.5, "window_minutes": 10})
    worker = new_worker(db_session)
    l1 = acquire(db_session, store, settings, worker)
    l2 = acquire(db_session, store, settings, worker)
    add_batch(db_session, run, worker, l1, state="rejected", reject_reason="stale")
    assert ("stale_waste", "fired") in evaluate_alarms(db_session)
    assert evaluate_alarms(db_session) == []  # still above: no second event
    assert evaluate_alarms(db_session) == []
    assert _events(db_session, run.id, "alarm.stale_waste") == 1
    # Waste falls to 4/12 < 0.5 with more good samples: cleared once, and the alarm re-arms.
    add_batch(db_session, run, worker, l2, state="accepted")
    l3 = acquire(db_session, store, settings, worker)
    add_batch(db_session, run, worker, l3, state="accepted")
    assert ("stale_waste", "cleared") in evaluate_alarms(db_session)
    assert _events(db_session, run.id, "alarm.stale_waste.cleared") == 1
    # A lease aborted because the run paused is not stale waste: nothing crosses.
    l5 = acquire(db_session, store, settings, worker)
    db_session.execute(
        update(Lease)
        .where(Lease.id == l5)
        .values(state="aborted", end_reason="run_paused", ended_at=db_now())
    )
    assert evaluate_alarms(db_session) == []
    # A lease aborted as stale counts: (4 + 4) / 16 = 0.5 crosses again.
    l4 = acquire(db_session, store, settings, worker)
    db_session.execute(
        update(Lease)
        .where(Lease.id == l4)
        .values(state="aborted", end_reason="stale", ended_at=db_now())
    )
    assert ("stale_waste", "fired") in evaluate_alarms(db_session)
    assert _events(db_session, run.id, "alarm.stale_waste") == 2


def test_clip_fraction_and_quarantine_alarms(db_session: Session) -> None:
    run = new_run(db_session, alarms={"clip_fraction": 0.3})
    worker = new_worker(db_session)
    db_session.add(
        MetricPoint(
            run_id=run.id,
            source="learner",
            step=1,
            values={"clip_low": 0.2, "clip_high": 0.15},
        )
    )
    db_session.execute(update(Worker).where(Worker.id == worker.id).values(status="quarantined"))
    crossings = evaluate_alarms(db_session)
    assert ("clip_fraction", "fired") in crossings
    assert ("worker_quarantined", "fired") in crossings
    assert evaluate_alarms(db_session) == []
    quarantine = db_session.execute(
        select(Event).where(Event.worker_id == worker.id, Event.kind == "alarm.worker_quarantined")
    ).scalar_one()
    assert quarantine.data["alarm"] == "worker_quarantined"


def test_budget_exhausted_run_hands_out_no_leases(
    db_session: Session, pg_url: str, tmp_path: Path
) -> None:
    settings = make_settings(pg_url, tmp_path / "bucket")
    store = make_store(settings)
    run = new_run(db_session, n_rows=8, budget_usd=5.0)
    worker = new_worker(db_session)
    assert acquire(db_session, store, settings, worker) is not None
    assert enforce_budgets(db_session) == []
    db_session.execute(update(Run).where(Run.id == run.id).values(spent_usd=5.0))
    assert enforce_budgets(db_session) == [run.id]
    assert enforce_budgets(db_session) == []  # one event, not one per pass
    db_session.refresh(run)
    assert run.status == "budget_exhausted"
    assert _events(db_session, run.id, "run.budget_exhausted") == 1
    assert acquire(db_session, store, settings, worker) is None


@pytest.mark.timeout(60)
def test_webhook_is_signed_and_retried_with_backoff(pg_url: str) -> None:
    engine = make_engine(pg_url)
    factory = make_sessionmaker(engine)
    with webhook_receiver([500, 500]) as receiver:
        with transaction(factory) as session:
            run = new_run(
                session, alarms={"no_version_minutes": 0.001, "webhook_url": receiver.url}
            )
            time.sleep(0.1)
            assert ("no_version", "fired") in evaluate_alarms(session)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            webhooks.deliver_due(
                factory,
                secret=TEST_SECRET,
                max_attempts=5,
                backoff_s=0.2,
                policy=OutboundPolicy(allow_private=True),  # the receiver is on 127.0.0.1
            )
            with transaction(factory) as session:
                delivery = session.execute(select(WebhookDelivery)).scalar_one()
            if delivery.state != "pending":
                break
            time.sleep(0.1)
    engine.dispose()
    assert delivery.state == "delivered" and delivery.attempts == 3
    assert [len(receiver.requests)] == [3]
    for headers, body in receiver.requests:
        assert webhooks.verify(TEST_SECRET, body, headers["x-asyncgrpo-signature"])
        assert not webhooks.verify(
            "another-secret-" + "y" * 32, body, headers["x-asyncgrpo-signature"]
        )
        payload = json.loads(body)
        assert payload["kind"] == "alarm.no_version" and payload["run_id"] == str(run.id)
