"""`admission_control` (benchmarks only): on, acquire answers 204 at the bound and a stale
lease's heartbeat aborts it; off, neither happens (the learner's claim still rejects stale)."""

from __future__ import annotations

import uuid

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.orm import Session

from server.models import Lease, Run
from tests.server.leases.helpers import in_flight, make_run, make_worker

BASE = "/api/v1/leases"


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize("admission_control", [True, False])
def test_admission_switch_bound_and_stale_abort(
    lease_client: TestClient, db: Session, admission_control: bool
) -> None:
    # bound (max_staleness 1 + 1) × 1 step × 4 groups = 8 groups, 2 per lease: 4 leases
    run = make_run(db, n_rows=20, max_staleness=1, admission_control=admission_control)
    _, token = make_worker(db)
    db.commit()
    answers = [lease_client.post(f"{BASE}/acquire", json={}, headers=_h(token)) for _ in range(6)]
    codes = [a.status_code for a in answers]
    assert codes == ([200] * 4 + [204] * 2 if admission_control else [200] * 6)
    db.refresh(run)
    assert run.groups_in_flight == in_flight(db, run.id) == (8 if admission_control else 12)
    db.commit()

    # the run moves two versions past the first lease's version 0: beyond max_staleness 1
    lease = answers[0].json()
    db.execute(update(Run).where(Run.id == run.id).values(current_version=2))
    db.commit()
    beat = lease_client.post(
        f"{BASE}/{lease['lease_id']}/heartbeat",
        json={"fencing": lease["fencing"]},
        headers=_h(token),
    )
    assert beat.status_code == 200
    assert beat.json()["abort"] is admission_control
    assert beat.json()["current_version"] == 2
    db.expire_all()
    row = db.get(Lease, uuid.UUID(lease["lease_id"]))
    assert row is not None
    assert row.state == ("aborted" if admission_control else "active")
    db.commit()
