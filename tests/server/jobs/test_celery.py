"""A real Celery worker (solo pool, beat embedded) against this machine's Redis and a fresh
Postgres database runs the scheduled jobs end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import Engine, func, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from server.config import Settings
from server.db import make_engine, make_sessionmaker, transaction
from server.db_types import db_now
from server.events import webhooks
from server.leases import queue
from server.models import (
    CostRecord,
    Event,
    GpuPrice,
    Lease,
    PromptRow,
    Run,
    WebhookDelivery,
    Worker,
)
from server.storage_factory import make_store
from tests.conftest import TEST_SECRET, _pg_url, make_settings
from tests.harness.broker import broker_url
from tests.server.jobs.factories import acquire, expire, new_run, new_worker
from tests.server.jobs.receiver import webhook_receiver

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(120)]

SILENT_S = 1.5


class Jobs:
    def __init__(self, url: str, settings: Settings, log: Path) -> None:
        self.engine = make_engine(url)
        self.factory: sessionmaker[Session] = make_sessionmaker(self.engine)
        self.settings = settings
        self.store = make_store(settings)
        self.log = log


@pytest.fixture(scope="module")
def jobs(
    pg_admin: Engine, pg_template: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Jobs]:
    name = f"agr_jobs_{uuid.uuid4().hex[:10]}"
    with pg_admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"'))
    url = _pg_url(name)
    broker = broker_url()
    redis.Redis.from_url(broker).flushdb()
    tmp = tmp_path_factory.mktemp("celery")
    env = {
        **os.environ,
        "ASYNCGRPO_DATABASE_URL": url,
        "ASYNCGRPO_BUCKET_URL": str(tmp / "bucket"),
        "ASYNCGRPO_SECURITY__SECRET_KEY": TEST_SECRET,
        "ASYNCGRPO_JOBS__MODE": "celery",
        "ASYNCGRPO_JOBS__BROKER_URL": broker,
        "ASYNCGRPO_JOBS__SWEEP_INTERVAL_S": "0.5",
        "ASYNCGRPO_JOBS__COST_INTERVAL_S": "0.5",
        "ASYNCGRPO_JOBS__BUDGET_INTERVAL_S": "0.5",
        "ASYNCGRPO_JOBS__ALARM_INTERVAL_S": "0.5",
        "ASYNCGRPO_JOBS__WEBHOOK_INTERVAL_S": "0.3",
        "ASYNCGRPO_JOBS__WEBHOOK_BACKOFF_S": "0.3",
        "ASYNCGRPO_JOBS__WORKER_SILENT_S": str(SILENT_S),
        "ASYNCGRPO_OUTBOUND_ALLOW_PRIVATE": "true",  # the webhook receiver is on 127.0.0.1
    }
    # a server has started on the database and recorded its bucket (the Celery app checks it)
    _bind_bucket(url, make_settings(url, tmp / "bucket"))
    log = tmp / "celery.log"
    celery = Path(sys.executable).parent / "celery"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                str(celery),
                "-A",
                "server.jobs.celery_app",
                "worker",
                "-B",
                "--pool",
                "solo",
                "--schedule",
                str(tmp / "beat-schedule"),
                "--loglevel",
                "INFO",
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=Path(__file__).parents[3],
        )
    state = Jobs(url, make_settings(url, tmp / "bucket"), log)
    try:
        yield state
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        state.engine.dispose()
        redis.Redis.from_url(broker).flushdb()
        with pg_admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def _bind_bucket(url: str, settings: Settings) -> None:
    from server.installation import bind_bucket

    engine = make_engine(url)
    try:
        bind_bucket(
            make_sessionmaker(engine), make_store(settings), settings.bucket_url, first=True
        )
    finally:
        engine.dispose()


def wait_for(jobs: Jobs, check: Callable[[Session], Any], timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        with transaction(jobs.factory) as session:
            value = check(session)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out; celery log:\n{jobs.log.read_text()[-3000:]}")
        time.sleep(0.2)


def test_expired_lease_is_swept_and_its_prompts_reissued(jobs: Jobs) -> None:
    with transaction(jobs.factory) as session:
        run = new_run(session)
        worker = new_worker(session)
        lease_id = acquire(session, jobs.store, jobs.settings, worker)
        assert lease_id is not None
        rows = set(
            session.execute(select(PromptRow.id).where(PromptRow.lease_id == lease_id)).scalars()
        )
        expire(session, lease_id)
    wait_for(jobs, lambda s: s.get(Lease, lease_id).state == "expired")
    with transaction(jobs.factory) as session:
        states = session.execute(
            select(PromptRow.state, PromptRow.attempts).where(PromptRow.id.in_(rows))
        ).all()
        assert states == [("queued", 1)] * len(rows)
        again = acquire(session, jobs.store, jobs.settings, session.get(Worker, worker.id))
        reissued = set(
            session.execute(select(PromptRow.id).where(PromptRow.lease_id == again)).scalars()
        )
    assert reissued == rows  # back at the front of the queue
    assert run.id is not None


def _run_usd(session: Session, run_id: uuid.UUID) -> float:
    return float(
        session.execute(
            select(func.coalesce(func.sum(CostRecord.usd), 0.0)).where(CostRecord.run_id == run_id)
        ).scalar_one()
    )


def test_cost_accrues_while_heartbeating_and_stops_when_silent(jobs: Jobs) -> None:
    with transaction(jobs.factory) as session:
        session.add(GpuPrice(gpu_type="celery-test-gpu", price_per_hour=36.0))
        run = new_run(session)
        worker = new_worker(session, price=1000.0, gpu_type="celery-test-gpu")
        assert acquire(session, jobs.store, jobs.settings, worker) is not None
    stop = threading.Event()

    def heartbeat() -> None:
        while not stop.is_set():
            with transaction(jobs.factory) as session:
                session.execute(
                    update(Worker).where(Worker.id == worker.id).values(last_seen_at=db_now())
                )
            stop.wait(0.3)

    beat = threading.Thread(target=heartbeat, daemon=True)
    beat.start()
    try:
        wait_for(jobs, lambda s: _run_usd(s, run.id) > 0.01)  # $0.01/s from the price table
    finally:
        stop.set()
        beat.join()
    time.sleep(SILENT_S + 2.0)
    with transaction(jobs.factory) as session:
        settled = _run_usd(session, run.id)
        spent = session.get(Run, run.id).spent_usd
        records = list(
            session.execute(select(CostRecord).where(CostRecord.worker_id == worker.id)).scalars()
        )
    assert spent == pytest.approx(settled)
    assert all(r.usd == pytest.approx(r.seconds * 0.01) for r in records)
    time.sleep(2.0)
    with transaction(jobs.factory) as session:
        assert _run_usd(session, run.id) == pytest.approx(settled)  # silent: no more accrual


def test_run_over_budget_is_exhausted_and_leases_nothing(jobs: Jobs) -> None:
    with transaction(jobs.factory) as session:
        run = new_run(session, n_rows=8, budget_usd=0.5)
        worker = new_worker(session, price=3600.0)  # $1/s
        assert acquire(session, jobs.store, jobs.settings, worker) is not None
    wait_for(jobs, lambda s: s.get(Run, run.id).status == "budget_exhausted")
    with transaction(jobs.factory) as session:
        session.execute(update(Worker).where(Worker.id == worker.id).values(last_seen_at=db_now()))
        # Other tests' runs share this database: whatever is granted is not from this run, and
        # the lease engine's admission compare-and-set refuses this run outright.
        granted = acquire(session, jobs.store, jobs.settings, session.get(Worker, worker.id))
        assert granted is None or session.get(Lease, granted).run_id != run.id
        assert queue.admit(session, run.id, 1, 1000) is None
        events = session.execute(
            select(func.count()).where(Event.run_id == run.id, Event.kind == "run.budget_exhausted")
        ).scalar_one()
        assert session.get(Run, run.id).spent_usd >= 0.5
    assert events == 1


def test_alarm_fires_once_and_the_signed_webhook_is_retried(jobs: Jobs) -> None:
    with webhook_receiver([500]) as receiver:
        with transaction(jobs.factory) as session:
            run = new_run(
                session, alarms={"no_version_minutes": 0.005, "webhook_url": receiver.url}
            )
        wait_for(
            jobs,
            lambda s: s.execute(
                select(WebhookDelivery).where(
                    WebhookDelivery.run_id == run.id, WebhookDelivery.state == "delivered"
                )
            ).scalar_one_or_none(),
        )
        time.sleep(2.0)  # several more evaluations while the alarm stays raised
        requests = list(receiver.requests)
    with transaction(jobs.factory) as session:
        fired = session.execute(
            select(func.count()).where(Event.run_id == run.id, Event.kind == "alarm.no_version")
        ).scalar_one()
        delivery = session.execute(
            select(WebhookDelivery).where(WebhookDelivery.run_id == run.id)
        ).scalar_one()
    assert fired == 1
    assert delivery.attempts == 2 and delivery.last_status == 200
    assert len(requests) == 2  # one 500, then the retry
    for headers, body in requests:
        assert webhooks.verify(TEST_SECRET, body, headers["x-asyncgrpo-signature"])
        assert json.loads(body)["data"]["alarm"] == "no_version"
