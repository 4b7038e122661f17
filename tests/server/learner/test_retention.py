"""Retention keeps exactly what invariant 13 protects."""

from __future__ import annotations

from sqlalchemy import update

from server.db import transaction
from server.models import Lease, RolloutBatch
from tests.harness.batches import accepted_batch
from tests.server.learner.support import (
    attach,
    deleted_versions,
    make_run,
    make_worker,
    retain,
    upload_and_publish,
    version_keys,
)


def test_retention_keeps_what_work_in_flight_needs(app, client) -> None:
    run = make_run(
        app,
        max_staleness=1,
        dataset={"kind": "jsonl", "rows": [{"prompt": f"p{i}", "answer": "1"} for i in range(8)]},
    )
    fencing = attach(client, run)["fencing"]
    worker_id, _ = make_worker(app)
    batch_on_3 = None
    for version in range(1, 7):
        assert upload_and_publish(client, run, fencing, version).status_code == 200
        if version == 3:
            batch_on_3 = accepted_batch(app, run.id, worker_id, version=3)
    assert batch_on_3 is not None
    # An active lease generating with version 2.
    lease_batch = accepted_batch(app, run.id, worker_id, version=2)
    with transaction(app.state.sessionmaker) as session:
        lease_id = session.get(RolloutBatch, lease_batch).lease_id  # type: ignore[union-attr]
        session.execute(
            update(RolloutBatch)
            .where(RolloutBatch.id == lease_batch)
            .values(state="rejected", reject_reason="invalid")
        )
        session.execute(update(Lease).where(Lease.id == lease_id).values(state="active"))
    store = app.state.store
    everything = {v: version_keys(app, run.id, v) for v in range(1, 7)}

    # current 6, max_staleness 1: 4, 5, 6 by the window; 3 by an accepted batch; 2 by a lease.
    deleted = retain(app, run.id)
    assert set(deleted) == everything[1]
    assert deleted_versions(app, run.id) == [1]
    assert all(store.head(k) is None for k in everything[1])
    assert all(store.head(k) is not None for v in range(2, 7) for k in everything[v])
    assert retain(app, run.id) == []  # idempotent

    # The lease ends and the batch is consumed: 2 and 3 are no longer protected.
    with transaction(app.state.sessionmaker) as session:
        session.execute(update(Lease).where(Lease.id == lease_id).values(state="completed"))
        session.execute(
            update(RolloutBatch)
            .where(RolloutBatch.id == batch_on_3)
            .values(state="consumed", consumed_version=6)
        )
    assert set(retain(app, run.id)) == everything[2] | everything[3]
    assert deleted_versions(app, run.id) == [1, 2, 3]
    assert all(store.head(k) is not None for v in (4, 5, 6) for k in everything[v])


def test_retention_keeps_the_final_version_and_latest_checkpoint(app, client) -> None:
    run = make_run(app, max_staleness=0)
    fencing = attach(client, run)["fencing"]
    for version in (1, 2, 3):
        final = version == 3
        assert upload_and_publish(client, run, fencing, version, final=final).status_code == 200
    everything = {v: version_keys(app, run.id, v) for v in (1, 2, 3)}
    # max_staleness 0 → the window is {2, 3}; 3 is also final and the latest checkpoint.
    assert set(retain(app, run.id)) == everything[1]
    assert deleted_versions(app, run.id) == [1]
    assert all(app.state.store.head(k) is not None for v in (2, 3) for k in everything[v])


def test_the_retention_job_applies_it_to_every_run(app, client) -> None:  # type: ignore[no-untyped-def]
    """The scheduled job (server/jobs/runner.py, "retention") reaches every run's versions."""
    from server.jobs.runner import JobContext, run_job

    runs = [make_run(app, max_staleness=0) for _ in range(2)]
    for run in runs:
        fencing = attach(client, run)["fencing"]
        for version in (1, 2, 3):
            assert upload_and_publish(client, run, fencing, version).status_code == 200
    context = JobContext(app.state.settings, app.state.sessionmaker, lambda: app.state.store)
    expected = sum(len(version_keys(app, run.id, 1)) for run in runs)
    assert run_job("retention", context) == expected
    assert [deleted_versions(app, run.id) for run in runs] == [[1], [1]]
    assert run_job("retention", context) == 0
