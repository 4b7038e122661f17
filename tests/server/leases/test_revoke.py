"""Revoking a worker ends its active leases at once (`aborted`, end_reason `revoked`) and puts
their prompts back at the front of the queue with no attempt counted, so that another worker
leases them at once rather than when the TTL runs out; the revoked worker's later calls answer
401 (docs/architecture/lease-engine.md, "The queue"). On every lease path."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from server.models import Lease, PromptRow, Run, Worker
from tests.conftest import mint_token
from tests.server.leases.helpers import acquire_lease, bearer, make_run, make_worker


def _row_ids(lease: dict[str, Any]) -> list[int]:
    return [p["prompt_row_id"] for p in lease["prompts"]]


def _rows(db: Session, row_ids: list[int]) -> dict[int, tuple[str, int, str | None]]:
    db.expire_all()
    found = db.execute(
        select(PromptRow.id, PromptRow.state, PromptRow.attempts, PromptRow.lease_id).where(
            PromptRow.id.in_(row_ids)
        )
    ).all()
    db.commit()
    return {r.id: (r.state, r.attempts, str(r.lease_id) if r.lease_id else None) for r in found}


def test_revoking_a_worker_releases_its_leases_at_once(
    lease_app: FastAPI, lease_client: TestClient, db: Session
) -> None:
    run = make_run(db, n_rows=8, lease_ttl_s=600.0)
    revoked, revoked_token = make_worker(db, name="revoked")
    _, other_token = make_worker(db, name="other")
    revoked_id, run_id = revoked.id, run.id  # read now: after commit, a read would hold SQLite
    db.commit()
    held = [acquire_lease(lease_client, revoked_token) for _ in range(2)]
    kept = acquire_lease(lease_client, other_token)  # another worker's lease: untouched
    row_ids = [r for lease in held for r in _row_ids(lease)]
    before = _rows(db, row_ids)
    assert {state for state, _, _ in before.values()} == {"leased"}
    in_flight_before = db.execute(select(Run.groups_in_flight).where(Run.id == run_id)).scalar()
    db.commit()

    admin = bearer(mint_token(lease_app, "admin", name="admin"))
    answer = lease_client.post(f"/api/v1/workers/{revoked_id}/revoke", headers=admin)

    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "revoked"
    db.expire_all()
    leases = {
        str(lease.id): lease
        for lease in db.execute(select(Lease).where(Lease.run_id == run_id)).scalars()
    }
    for lease in held:
        ended = leases[lease["lease_id"]]
        assert (ended.state, ended.end_reason) == ("aborted", "revoked")
        assert ended.ended_at is not None
    assert leases[kept["lease_id"]].state == "active"
    in_flight = db.execute(select(Run.groups_in_flight).where(Run.id == run_id)).scalar()
    db.commit()
    assert in_flight == in_flight_before - len(row_ids)  # type: ignore[operator]
    after = _rows(db, row_ids)
    assert after == {r: ("queued", attempts, None) for r, (_, attempts, _) in before.items()}
    reasons = db.execute(
        select(PromptRow.last_requeue_reason).where(PromptRow.id.in_(row_ids))
    ).scalars()
    assert set(reasons) == {"revoked"}
    db.commit()

    # another worker leases the same prompts at once (the front of the queue), in their order
    again = [acquire_lease(lease_client, other_token) for _ in range(2)]
    assert [r for lease in again for r in _row_ids(lease)] == row_ids
    assert {uuid.UUID(lease["lease_id"]) for lease in again}.isdisjoint(
        uuid.UUID(lease["lease_id"]) for lease in held
    )

    # the revoked worker's later calls are refused: its token is revoked with it
    first = held[0]
    beat = {"fencing": first["fencing"]}
    for path, body in (
        (f"/api/v1/leases/{first['lease_id']}/heartbeat", beat),
        ("/api/v1/leases/heartbeat", {"leases": [{"lease_id": first["lease_id"], **beat}]}),
        ("/api/v1/leases/acquire", {}),
    ):
        refused = lease_client.post(path, json=body, headers=bearer(revoked_token))
        assert refused.status_code == 401, (path, refused.text)


def test_revoking_a_worker_with_no_lease_or_twice_changes_no_lease(
    lease_app: FastAPI, lease_client: TestClient, db: Session
) -> None:
    run = make_run(db, n_rows=4)
    idle, _ = make_worker(db, name="idle")
    _, busy_token = make_worker(db, name="busy")
    idle_id, run_id = idle.id, run.id
    db.commit()
    lease = acquire_lease(lease_client, busy_token)
    admin = bearer(mint_token(lease_app, "admin", name="admin"))
    for _ in range(2):
        answer = lease_client.post(f"/api/v1/workers/{idle_id}/revoke", headers=admin)
        assert answer.status_code == 200, answer.text
    db.expire_all()
    states = db.execute(select(Lease.state).where(Lease.run_id == run_id)).scalars().all()
    rows = _rows(db, _row_ids(lease))
    assert states == ["active"]
    assert {state for state, _, _ in rows.values()} == {"leased"}
    missing = lease_client.post(f"/api/v1/workers/{uuid.uuid4()}/revoke", headers=admin)
    assert missing.status_code == 404


def test_the_sweep_job_ends_a_lease_granted_while_its_worker_was_revoked(
    lease_app: FastAPI, lease_client: TestClient, db: Session
) -> None:
    """A grant that read the worker active and committed after the revoke ended the worker's
    leases: the sweep job ends it `revoked` too, with no attempt counted."""
    from server.jobs.runner import JobContext, sweep

    run = make_run(db, n_rows=4, lease_ttl_s=600.0)
    worker, token = make_worker(db, name="late")
    _, other_token = make_worker(db, name="other")
    worker_id, run_id = worker.id, run.id
    db.commit()
    late = acquire_lease(lease_client, token)
    kept = acquire_lease(lease_client, other_token)
    before = _rows(db, _row_ids(late))
    db.execute(update(Worker).where(Worker.id == worker_id).values(status="revoked"))
    db.commit()

    context = JobContext(lease_app.state.settings, lease_app.state.sessionmaker, lambda: None)  # type: ignore[arg-type,return-value]
    assert sweep(context) == 1

    db.expire_all()
    ends = dict(db.execute(select(Lease.id, Lease.end_reason).where(Lease.run_id == run_id)).all())
    db.commit()
    assert ends == {uuid.UUID(late["lease_id"]): "revoked", uuid.UUID(kept["lease_id"]): None}
    assert _rows(db, _row_ids(late)) == {r: ("queued", a, None) for r, (_, a, _) in before.items()}
    assert sweep(context) == 0
