"""A worker silent past the silence threshold (settings.jobs.worker_silent_s) shows as offline
in the API's worker list, the dashboard's workers and run pages, and /metrics; one that calls
shows as online; revoked stays revoked."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import update

from server.db import transaction
from server.db_types import db_now_plus
from server.models import Worker
from server.workers.liveness import worker_state
from tests.server.dashboard.test_pages import login
from tests.server.jobs.factories import acquire, new_run, new_worker


def _seed(app: Any) -> dict[str, Any]:
    """A worker seen now, one silent just past the threshold (holding a lease of the run, as
    a stopped demo's worker does), and a revoked one."""
    silent_s = app.state.settings.jobs.worker_silent_s
    with transaction(app.state.sessionmaker) as session:
        run = new_run(session, n_rows=8)
        live = new_worker(session, name="calling")
        gone = new_worker(session, name="stopped")
        revoked = new_worker(session, name="revoked-one")
        assert acquire(session, app.state.store, app.state.settings, gone) is not None
        session.execute(
            update(Worker)
            .where(Worker.id == gone.id)
            .values(last_seen_at=db_now_plus(-(silent_s + 5.0)))
        )
        session.execute(update(Worker).where(Worker.id == revoked.id).values(status="revoked"))
        return {"run": run.id, "live": live.id, "gone": gone.id, "revoked": revoked.id}


def test_api_worker_list_derives_the_state(
    client: TestClient, app: Any, admin_headers: dict[str, str]
) -> None:
    ids = _seed(app)
    listed = {w["id"]: w for w in client.get("/api/v1/workers", headers=admin_headers).json()}
    assert listed[str(ids["live"])]["state"] == "online"
    assert listed[str(ids["gone"])]["state"] == "offline"
    assert listed[str(ids["gone"])]["status"] == "active"  # the stored status is unchanged
    assert listed[str(ids["revoked"])]["state"] == "revoked"


def test_dashboard_shows_silent_workers_offline(
    client: TestClient, app: Any, admin_token: str
) -> None:
    ids = _seed(app)
    login(client, admin_token)
    page = client.get("/workers").text
    rows = {name: page.split(f'data-worker="{name}"')[1].split("</tr>")[0]
            for name in ("calling", "stopped", "revoked-one")}  # fmt: skip
    assert 'data-worker-state="online"' in rows["calling"]
    assert 'data-worker-state="offline"' in rows["stopped"]
    assert 'data-worker-state="revoked"' in rows["revoked-one"]
    run_page = client.get(f"/runs/{ids['run']}/live").text
    leases = run_page.split('aria-label="Live leases"')[1].split("</table>")[0]
    assert "stopped" in leases and 'data-worker-state="offline"' in leases


def test_metrics_count_silent_workers_as_offline(client: TestClient, app: Any) -> None:
    ids = _seed(app)
    by_state: dict[str, float] = {}
    info_state: dict[str, str] = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == "asyncgrpo_workers":
                by_state[sample.labels["state"]] = sample.value
            if sample.name == "asyncgrpo_worker_info":
                info_state[sample.labels["worker_id"]] = sample.labels["state"]
    assert by_state == {"online": 1, "offline": 1, "quarantined": 0, "revoked": 1}
    assert info_state[str(ids["gone"])] == "offline"
    assert info_state[str(ids["live"])] == "online"


def test_state_rule_at_the_threshold() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    at = now - timedelta(seconds=60)
    assert worker_state("active", at, now, 60.0) == "online"  # silent means *past* it
    assert worker_state("active", at - timedelta(seconds=1), now, 60.0) == "offline"
    assert worker_state("active", None, now, 60.0) == "offline"
    assert worker_state("quarantined", now, now, 60.0) == "quarantined"
