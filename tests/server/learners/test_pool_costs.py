"""A pool learner's alive time × its reported price, split evenly over the learner leases it
holds (server/jobs/costs.py `attribute`, the workers' rule); a run's learner_price_per_hour is
not charged for a pool learner's time."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from server.db import transaction
from server.db_types import db_now_plus
from server.jobs.costs import accrue_costs
from server.models import CostRecord, Run
from tests.server.learner.support import make_run
from tests.server.learners.conftest import attach, backdate, register, take, taken_ids

pytestmark = pytest.mark.timeout(120)


def test_pool_learner_time_is_split_over_its_two_held_runs(runs_app, runs_client) -> None:
    runs = [make_run(runs_app, learner_price_per_hour=100.0) for _ in range(2)]
    learner_id, pool = register(runs_client, runs_app, price_per_hour=3.6)
    assert set(taken_ids(take(runs_client, pool, 2))) == {r.id for r in runs}
    for run in runs:
        assert attach(runs_client, pool, run.id).status_code == 200
    backdate(runs_app, learner_id, [r.id for r in runs], 100.0, learner_expires_at=db_now_plus(900))
    with transaction(runs_app.state.sessionmaker) as session:
        charged = accrue_costs(session, silent_s=60.0)
        records = list(session.execute(select(CostRecord)).scalars())
    pool_records = {r.run_id: r for r in records if r.kind == "pool_learner"}
    assert set(pool_records) == {r.id for r in runs}  # no idle share: both held all along
    first, second = (pool_records[r.id] for r in runs)
    assert first.seconds == pytest.approx(second.seconds)
    assert first.seconds >= 50.0 and first.pool_learner_id == learner_id
    assert first.usd == pytest.approx(first.seconds * 3.6 / 3600.0)
    assert charged == pytest.approx(first.usd + second.usd)
    assert [r for r in records if r.kind == "learner"] == []  # not the run's learner price
    with transaction(runs_app.state.sessionmaker) as session:
        again = accrue_costs(session, silent_s=60.0)
    assert 0.0 <= again < first.usd  # a later pass charges only the seconds since the first
    with transaction(runs_app.state.sessionmaker) as session:
        spent = session.execute(select(Run.spent_usd).where(Run.id == runs[0].id)).scalar_one()
    assert spent >= first.usd
