"""`GET /metrics` parses with prometheus_client's parser and carries the run's figures."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import update

from server.db import transaction
from server.models import MetricPoint, Run
from tests.server.jobs.factories import acquire, add_batch, new_run, new_worker


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_carry_run_and_worker_figures(client: TestClient, app: Any) -> None:
    with transaction(app.state.sessionmaker) as session:
        run = new_run(session, n_rows=8)
        worker = new_worker(session, price=2.5)
        l1 = acquire(session, app.state.store, app.state.settings, worker)
        l2 = acquire(session, app.state.store, app.state.settings, worker)
        add_batch(session, run, worker, l1, state="rejected", reject_reason="stale", staleness=3)
        session.add(
            MetricPoint(
                run_id=run.id,
                source="learner",
                step=7,
                values={"clip_low": 0.1, "clip_high": 0.025},
            )
        )
        session.execute(
            update(Run).where(Run.id == run.id).values(current_version=5, spent_usd=1.75)
        )
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = _samples(response.text)
    rid = (("run_id", str(run.id)),)
    assert samples[("asyncgrpo_run_current_version", rid)] == 5
    assert samples[("asyncgrpo_run_spent_usd", rid)] == 1.75
    assert samples[("asyncgrpo_run_leases_in_flight", rid)] == 2
    assert samples[("asyncgrpo_run_groups_in_flight", rid)] == 4
    assert samples[("asyncgrpo_run_clip_fraction", rid)] == 0.125
    assert samples[("asyncgrpo_run_stale_waste_ratio", rid)] == 1.0
    assert samples[("asyncgrpo_run_staleness_max", rid)] == 3
    key = ("asyncgrpo_run_rejected_batches_total", (("reason", "stale"), ("run_id", str(run.id))))
    assert samples[key] == 1
    wid = (("worker_id", str(worker.id)),)
    assert samples[("asyncgrpo_worker_leases_in_flight", wid)] == 2
    assert samples[("asyncgrpo_worker_price_per_hour", wid)] == 2.5
    assert 0 <= samples[("asyncgrpo_worker_last_seen_age_seconds", wid)] < 60
    assert l2 is not None
