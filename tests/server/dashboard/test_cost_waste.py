"""The cost page's waste vocabulary (server/runs/waste.py): spend on leases whose work was lost is
wasted spend by cause (rejected, expired, aborted stale, its worker revoked); spend on leases
aborted because the run paused or was cancelled is not waste (invariant 16) and shows as its own
figure."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from server.dashboard.costs import cost_page
from server.db import transaction
from server.models import CostRecord, Lease
from server.runs.waste import REVOKED
from tests.conftest import make_settings
from tests.server.dashboard.test_pages import login
from tests.server.learner.support import make_run, make_worker

# (lease state, end reason) → its cost in USD
LEASES = {
    ("aborted", "stale"): 1.0,
    ("aborted", "run_paused"): 2.0,
    ("aborted", "run_cancelled"): 4.0,
    ("aborted", REVOKED): 64.0,  # its worker was revoked: the work is lost, the run goes on
    ("expired", None): 8.0,
    ("completed", "completed"): 16.0,  # no batch rejected: spend that produced a batch
    ("released", "shutdown"): 32.0,
}


@pytest.fixture
def settings(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    return make_settings(db_url, tmp_path / "bucket")


def _spend_on_leases(app, run_id: uuid.UUID, worker_id: uuid.UUID) -> None:  # type: ignore[no-untyped-def]
    now = datetime.now(UTC)
    with transaction(app.state.sessionmaker) as session:
        for fencing, ((state, reason), usd) in enumerate(LEASES.items(), start=1):
            lease = Lease(
                run_id=run_id,
                worker_id=worker_id,
                adapter_version=0,
                fencing=fencing,
                state=state,
                end_reason=reason,
                expires_at=now,
                ended_at=now,
                seed=1,
                n_prompts=1,
                group_size=2,
            )
            session.add(lease)
            session.flush()
            session.add(
                CostRecord(
                    run_id=run_id,
                    worker_id=worker_id,
                    lease_id=lease.id,
                    kind="worker",
                    seconds=60.0,
                    usd=usd,
                    period_start=now,
                    period_end=now,
                )
            )


def test_pause_and_cancel_aborts_are_not_wasted_spend(
    client: TestClient,
    app,
    admin_token: str,  # type: ignore[no-untyped-def]
) -> None:
    run = make_run(app)
    worker_id, _ = make_worker(app)
    _spend_on_leases(app, run.id, worker_id)
    with transaction(app.state.sessionmaker) as session:
        page = cost_page(session, {})
    stale, paused, cancelled = (
        LEASES[("aborted", r)] for r in ("stale", "run_paused", "run_cancelled")
    )
    expired, revoked = LEASES[("expired", None)], LEASES[("aborted", REVOKED)]
    assert page.wasted_usd == {
        "rejected": 0.0,
        "expired": expired,
        "aborted_stale": stale,
        "worker_revoked": revoked,
    }
    assert page.stopped_run_usd == paused + cancelled
    [row] = [r for r in page.runs if r.id == run.id]
    assert row.wasted == {"expired": expired, "aborted_stale": stale, "worker_revoked": revoked}
    assert row.stopped_run_usd == paused + cancelled

    login(client, admin_token)
    html = client.get("/cost").text
    assert f'id="wasted-aborted_stale">${stale:,.2f}<' in html
    assert f'id="stopped-run">${paused + cancelled:,.2f}<' in html
    assert f'id="wasted-worker_revoked">${revoked:,.2f}<' in html
    assert "wasted: aborted stale" in html and "(not waste)" in html
