"""Stale waste is one figure (docs/architecture/contract.md, invariant 16): the alarm, Prometheus,
the API's proxy stats and the dashboard's chart read the same number on a run that has a batch
accepted, a batch rejected stale, a lease aborted as stale and a lease aborted because the run
paused (which is not waste). Before server/runs/waste.py the chart counted the paused abort."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from protocol.schemas import HeartbeatRequest
from server.dashboard import service as dashboard
from server.db import db_time
from server.jobs import alarms
from server.leases import fenced
from server.models import Lease, Run, Worker
from server.runs import lifecycle
from server.runs import service as runs
from server.runs.waste import ABORTED_STALE, stale_waste
from tests.conftest import mint_token
from tests.server.dashboard.test_pages import login
from tests.server.jobs.factories import (
    acquire,
    add_batch,
    engine_call,
    new_run,
    new_worker,
    worker_caller,
)

SAMPLES_PER_LEASE = 4  # 2 prompts × group size 2 (tests/server/jobs/factories.new_run)
EVERY_TIMESTAMP_IN_ONE_BUCKET = 10**10


def _heartbeat(app: Any, session: Session, worker: Worker, lease_id: uuid.UUID) -> str | None:
    fencing = session.execute(select(Lease.fencing).where(Lease.id == lease_id)).scalar_one()
    caller = worker_caller(session, app.state.store, app.state.settings, worker)
    answer = engine_call(fenced.heartbeat(caller, lease_id, HeartbeatRequest(fencing=fencing)))
    assert answer.abort
    return answer.reason


def _arrange(app: Any) -> uuid.UUID:
    """One batch accepted, one rejected stale, one lease aborted stale, one aborted paused."""
    session = app.state.sessionmaker()
    try:
        run = new_run(session, n_rows=8)
        worker = new_worker(session)
        store, settings = app.state.store, app.state.settings
        granted = [acquire(session, store, settings, worker) for _ in range(4)]
        accepted, rejected, stale, paused = (g for g in granted if g is not None)
        add_batch(session, run, worker, accepted, state="accepted", generation_seconds=3.0)
        add_batch(session, run, worker, rejected, state="rejected", reject_reason="stale",
                  generation_seconds=3.0)  # fmt: skip
        lifecycle.admin_action(session, run.id, "pause", None)
        assert _heartbeat(app, session, worker, paused) == "run_paused"
        # Running again (no learner has attached, so `resume` would say pending) and 5 versions on.
        session.execute(
            update(Run).where(Run.id == run.id).values(status="running", current_version=5)
        )
        assert _heartbeat(app, session, worker, stale) == "stale"
        session.commit()
        return run.id
    finally:
        session.close()


def _prometheus(client: TestClient, run_id: uuid.UUID) -> float:
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == "asyncgrpo_run_stale_waste_ratio":
                if sample.labels["run_id"] == str(run_id):
                    return float(sample.value)
    raise AssertionError("no stale waste gauge for the run")


def test_every_reader_gives_the_same_stale_waste(
    runs_app: Any, runs_client: TestClient, admin: dict[str, str]
) -> None:
    run_id = _arrange(runs_app)
    expected = 2 * SAMPLES_PER_LEASE / (3 * SAMPLES_PER_LEASE)  # the paused abort is no waste

    with runs_app.state.sessionmaker() as session:
        whole = stale_waste(session, run_id)
        windowed = stale_waste(session, run_id, window_s=600.0)
        run = runs.get_run(session, run_id)
        reading = next(
            r
            for r in alarms.run_readings(session, run, db_time(session))
            if r.kind == "stale_waste"
        )
        chart = dashboard.waste_chart(session, run_id, EVERY_TIMESTAMP_IN_ONE_BUCKET)
    api = runs_client.get(f"/api/v1/runs/{run_id}/metrics", headers=admin).json()["proxy"]

    assert whole == windowed
    assert (whole.generated, whole.wasted) == (3 * SAMPLES_PER_LEASE, 2 * SAMPLES_PER_LEASE)
    assert whole.ratio == reading.value == api["stale_waste"] == expected
    assert _prometheus(runs_client, run_id) == expected
    assert chart["waste"] == [expected]
    by_reason = dict(zip(chart["reasons"], chart["by_reason"], strict=True))
    assert by_reason == {"stale": [SAMPLES_PER_LEASE], ABORTED_STALE: [SAMPLES_PER_LEASE]}
    assert (api["samples_generated"], api["samples_aborted"]) == (12, SAMPLES_PER_LEASE)


def test_worker_seconds_count_stale_batches_and_stale_aborted_leases(runs_app: Any) -> None:
    run_id = _arrange(runs_app)
    with runs_app.state.sessionmaker() as session:
        waste = stale_waste(session, run_id)
        created, ended = session.execute(
            select(Lease.created_at, Lease.ended_at).where(
                Lease.run_id == run_id, Lease.end_reason == "stale"
            )
        ).one()
    assert waste.batch_seconds == 6.0 and waste.stale_rejected_seconds == 3.0
    assert abs(waste.stale_aborted_seconds - (ended - created).total_seconds()) < 1e-3
    assert waste.wasted_worker_seconds == 3.0 + waste.stale_aborted_seconds


def test_the_window_leaves_out_what_ended_before_it(runs_app: Any) -> None:
    run_id = _arrange(runs_app)
    with runs_app.state.sessionmaker() as session:
        assert stale_waste(session, run_id, window_s=-60.0).generated == 0


def test_the_run_page_charts_show_aborted_stale_not_paused(
    runs_app: Any, runs_client: TestClient
) -> None:
    run_id = _arrange(runs_app)
    login(runs_client, mint_token(runs_app, "admin", name="dash"))
    charts = runs_client.get(f"/runs/{run_id}/charts.json").json()
    labels = charts["rejections"]["labels"]
    assert f"{ABORTED_STALE} (samples)" in labels
    assert not any(label.startswith("aborted ") for label in labels)
    assert sum(sum(series) for series in charts["rejections"]["data"][1:]) == 8
