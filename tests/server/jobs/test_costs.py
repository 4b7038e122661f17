"""Cost accrual against Postgres (one rolled-back transaction per test)."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from server.db_types import db_now_plus
from server.jobs.costs import Span, accrue_costs, attribute
from server.models import CostRecord, GpuPrice, Run, Worker
from server.storage_factory import make_store
from tests.conftest import make_settings
from tests.server.jobs.factories import acquire, new_run, new_worker


def test_attribute_splits_overlaps_and_idle_time() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    r1, r2, l1, l2 = uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    spans = [
        Span(l1, r1, t0, t0 + timedelta(seconds=10)),
        Span(l2, r2, t0 + timedelta(seconds=5), t0 + timedelta(seconds=15)),
    ]
    out = attribute(t0, t0 + timedelta(seconds=20), spans)
    assert out[(r1, l1)] == pytest.approx(7.5)
    assert out[(r2, l2)] == pytest.approx(7.5)
    assert out[(None, None)] == pytest.approx(5.0)
    assert sum(out.values()) == pytest.approx(20.0)


def _records(session: Session, worker_id: uuid.UUID) -> list[CostRecord]:
    return list(
        session.execute(select(CostRecord).where(CostRecord.worker_id == worker_id)).scalars()
    )


def test_worker_time_goes_to_the_leased_run_at_the_price_table(
    db_session: Session, pg_url: str, tmp_path: Path
) -> None:
    settings = make_settings(pg_url, tmp_path / "bucket")
    db_session.add(GpuPrice(gpu_type="h200-test", price_per_hour=7200.0))
    run = new_run(db_session)
    worker = new_worker(db_session, price=1.0, gpu_type="h200-test")
    assert acquire(db_session, make_store(settings), settings, worker) is not None
    time.sleep(0.3)
    charged = accrue_costs(db_session, silent_s=60)
    records = _records(db_session, worker.id)
    to_run = [r for r in records if r.run_id == run.id]
    assert to_run and charged > 0
    for r in records:  # the admin table (7200/h = $2/s) overrides the self-reported $1/h
        assert r.usd == pytest.approx(r.seconds * 2.0)
    db_session.refresh(run)
    assert run.spent_usd == pytest.approx(sum(r.usd for r in to_run))
    # A second pass charges only the time since the first: nothing is charged twice.
    seconds_before = sum(r.seconds for r in records)
    accrue_costs(db_session, silent_s=60)
    total = sum(r.seconds for r in _records(db_session, worker.id))
    alive = db_session.execute(
        select(func.extract("epoch", func.clock_timestamp() - Worker.created_at)).where(
            Worker.id == worker.id
        )
    ).scalar_one()
    assert seconds_before < total <= float(alive) + 1e-3


def test_a_silent_worker_stops_accruing(db_session: Session) -> None:
    worker = new_worker(db_session, price=3600.0)
    accrue_costs(db_session, silent_s=60)
    db_session.execute(
        update(Worker).where(Worker.id == worker.id).values(last_seen_at=db_now_plus(-120.0))
    )
    time.sleep(0.2)
    accrue_costs(db_session, silent_s=60)
    before = sum(r.usd for r in _records(db_session, worker.id))
    time.sleep(0.2)
    accrue_costs(db_session, silent_s=60)
    assert sum(r.usd for r in _records(db_session, worker.id)) == pytest.approx(before)
    assert all(r.run_id is None for r in _records(db_session, worker.id))  # idle: the pool


def test_learner_time_is_charged_at_the_run_learner_price(db_session: Session) -> None:
    run = new_run(db_session, learner_price_per_hour=3600.0)
    db_session.execute(
        update(Run)
        .where(Run.id == run.id)
        .values(learner_attached_at=db_now_plus(-10.0), learner_expires_at=db_now_plus(30.0))
    )
    accrue_costs(db_session, silent_s=60)
    learner = list(
        db_session.execute(
            select(CostRecord).where(CostRecord.run_id == run.id, CostRecord.kind == "learner")
        ).scalars()
    )
    assert len(learner) == 1
    assert 10.0 <= learner[0].seconds < 12.0
    assert learner[0].usd == pytest.approx(learner[0].seconds)
    db_session.refresh(run)
    assert run.spent_usd == pytest.approx(learner[0].usd)
