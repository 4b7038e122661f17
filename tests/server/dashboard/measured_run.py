"""A run with measurements to plan from: real leases from the lease engine, batch rows and
learner points with chosen times (tests/server/dashboard/test_measured.py says what they give)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import update

from server.db import db_time, transaction
from server.models import Lease, MetricPoint, RolloutBatch, Run
from tests.server.jobs.factories import acquire, add_batch, new_run, new_worker


def make_measured_run(app: Any) -> Run:
    with transaction(app.state.sessionmaker) as session:
        run = new_run(session, n_rows=20)  # group 2, bound (4 + 1) · 1 · 2 = 10 groups
        l4 = new_worker(session, gpu_type="L4")
        a10g = new_worker(session, gpu_type="A10G")
        leases = [acquire(session, app.state.store, app.state.settings, l4) for _ in range(3)]
        leases.append(acquire(session, app.state.store, app.state.settings, a10g))
        assert None not in leases
        now = db_time(session)
        # (lease, worker, leased s ago, uploaded s ago, tokens, state)
        plan = [
            (leases[0], l4, 800, 700, 99_999, "accepted"),  # outside the 10-minute window
            (leases[1], l4, 100, 50, 2000, "accepted"),
            (leases[2], l4, 60, 20, 2000, "accepted"),
            (leases[3], a10g, 40, 20, 600, "rejected"),
        ]
        for lease_id, worker, leased, uploaded, tokens, state in plan:
            session.execute(
                update(Lease)
                .where(Lease.id == lease_id)
                .values(created_at=now - timedelta(seconds=leased))
            )
            batch = add_batch(session, run, worker, lease_id, n_tokens=tokens, state=state)
            session.execute(
                update(RolloutBatch)
                .where(RolloutBatch.id == batch.id)
                .values(created_at=now - timedelta(seconds=uploaded))
            )
        for step, values in enumerate(({"tokens_per_s": 100.0}, {"tokens_per_s": 200.0}, {})):
            session.add(MetricPoint(run_id=run.id, source="learner", step=step, values=values))
        session.expunge(run)
    return run
