"""Learner rejections, spot checks (worker quarantine) and learner metrics."""

from __future__ import annotations

import time

from sqlalchemy import select

from server.db import transaction
from server.models import Event, RolloutBatch, WebhookDelivery, Worker
from tests.harness.batches import accepted_batch
from tests.server.learner.support import attach, claim, make_run, make_worker, row_states, run_row


def test_reject_requeues_rows_and_counts_against_the_worker(app, client) -> None:
    run = make_run(app)
    fencing = attach(client, run)["fencing"]
    worker_id, _ = make_worker(app)
    batch = accepted_batch(app, run.id, worker_id, version=0)
    unclaimed = client.post(
        run.url(f"batches/{batch}/reject"),
        json={"fencing": fencing, "reason": "checksum"},
        headers=run.headers,
    )
    assert unclaimed.status_code == 409  # not claimed by this learner yet
    claim(client, run, fencing)
    bad_reason = client.post(
        run.url(f"batches/{batch}/reject"),
        json={"fencing": fencing, "reason": "stale"},
        headers=run.headers,
    )
    assert bad_reason.status_code == 422
    response = client.post(
        run.url(f"batches/{batch}/reject"),
        json={"fencing": fencing, "reason": "prompt_mismatch", "detail": "ids differ at 3"},
        headers=run.headers,
    )
    assert response.status_code == 200, response.text
    assert response.json()["requeued"] == 2 and response.json()["dropped"] == 0
    with transaction(app.state.sessionmaker) as session:
        row = session.get(RolloutBatch, batch)
        worker = session.get(Worker, worker_id)
        assert row is not None and worker is not None
        assert (row.state, row.reject_reason, row.reject_detail) == (
            "rejected",
            "prompt_mismatch",
            "ids differ at 3",
        )
        assert worker.rejected_batches == 1
    assert (
        sorted(row_states(app, run.id).values())
        == [("queued", 0, None)] * 2 + [("queued", 1, None)] * 2
    )
    assert run_row(app, run.id).groups_in_flight == 0
    twice = client.post(
        run.url(f"batches/{batch}/reject"),
        json={"fencing": fencing, "reason": "invalid"},
        headers=run.headers,
    )
    assert twice.status_code == 409


def test_reward_error_rejections_requeue_and_count_as_accepted(app, client, admin_headers) -> None:
    """A reward that raised or timed out on a batch (the learner's `reward_error`): its rows
    re-queued with an attempt, dropped `reward_error_exhausted` after max_attempts, and the
    batch counted as accepted (it passed `complete`) in the proxy figures."""
    run = make_run(app, max_attempts=2)
    fencing = attach(client, run)["fencing"]
    worker_id, _ = make_worker(app)
    for attempt in (1, 2):
        batch = accepted_batch(app, run.id, worker_id, version=0)
        claim(client, run, fencing)
        response = client.post(
            run.url(f"batches/{batch}/reject"),
            json={"fencing": fencing, "reason": "reward_error", "detail": "reward 'm:f': timeout"},
            headers=run.headers,
        )
        assert response.status_code == 200, response.text
        assert (response.json()["requeued"], response.json()["dropped"]) == (
            (2, 0) if attempt == 1 else (0, 2)
        )
    states = sorted(row_states(app, run.id).values())
    assert states[:2] == [("dropped", 2, "reward_error_exhausted")] * 2
    proxy = client.get(run.url("metrics"), headers=admin_headers).json()["proxy"]
    assert proxy["rejected_by_reason"] == {"reward_error": 2}
    assert proxy["batches_accepted"] == 2


def test_env_mismatch_rejection_counts_against_the_worker(app, client, admin_headers) -> None:
    """A trajectory whose environment turns or tool results the learner could not re-derive
    (`env_mismatch`): the batch rejected, its rows re-queued, the worker's count raised."""
    run = make_run(app)
    fencing = attach(client, run)["fencing"]
    worker_id, _ = make_worker(app)
    batch = accepted_batch(app, run.id, worker_id, version=0)
    claim(client, run, fencing)
    detail = "row 0: calculator('2*3') gives '6', the transcript says '7'"
    response = client.post(
        run.url(f"batches/{batch}/reject"),
        json={"fencing": fencing, "reason": "env_mismatch", "detail": detail},
        headers=run.headers,
    )
    assert response.status_code == 200, response.text
    assert response.json()["requeued"] == 2
    with transaction(app.state.sessionmaker) as session:
        row = session.get(RolloutBatch, batch)
        worker = session.get(Worker, worker_id)
        assert row is not None and worker is not None
        assert (row.reject_reason, row.reject_detail) == ("env_mismatch", detail)
        assert worker.rejected_batches == 1
    proxy = client.get(run.url("metrics"), headers=admin_headers).json()["proxy"]
    assert proxy["rejected_by_reason"] == {"env_mismatch": 1}


def test_spot_check_above_threshold_quarantines_the_worker(app, client) -> None:
    hook = "http://127.0.0.1:9/hook"
    run = make_run(app, alarms={"spot_check_mismatch": 0.05, "webhook_url": hook})
    fencing = attach(client, run)["fencing"]
    worker_id, _ = make_worker(app)
    batch = accepted_batch(app, run.id, worker_id, version=0)

    def check(value: float) -> dict:  # type: ignore[type-arg]
        response = client.post(
            run.url("spot-checks"),
            json={
                "fencing": fencing,
                "worker_id": str(worker_id),
                "batch_id": str(batch),
                "mean_abs_logprob_diff": value,
                "kl": 0.0,
                "n_tokens": 64,
            },
            headers=run.headers,
        )
        assert response.status_code == 200, response.text
        return dict(response.json())

    ok = check(0.01)
    assert (ok["worker_status"], ok["quarantined"], ok["spot_checks"]) == ("active", False, 1)
    ok = check(0.03)
    assert abs(ok["spot_check_mismatch"] - 0.02) < 1e-9 and ok["worker_status"] == "active"
    bad = check(0.5)
    assert bad["quarantined"] is True and bad["worker_status"] == "quarantined"
    with transaction(app.state.sessionmaker) as session:
        worker = session.get(Worker, worker_id)
        assert worker is not None and worker.status == "quarantined"
        assert worker.spot_checks == 3
        assert abs((worker.spot_check_mismatch or 0) - (0.01 + 0.03 + 0.5) / 3) < 1e-9
        events = list(session.execute(select(Event).where(Event.severity != "info")).scalars())
        # Raised like every event (server/events): queued for the run's webhook too.
        deliveries = session.execute(select(WebhookDelivery.event_id, WebhookDelivery.url)).all()
    assert [(e.kind, e.worker_id, e.run_id) for e in events] == [
        ("worker_quarantined", worker_id, run.id)
    ]
    assert [tuple(d) for d in deliveries] == [(events[0].id, hook)]
    again = check(0.6)
    assert again["quarantined"] is False and again["worker_status"] == "quarantined"
    other_worker, _ = make_worker(app)
    mismatch = client.post(
        run.url("spot-checks"),
        json={
            "fencing": fencing,
            "worker_id": str(other_worker),
            "batch_id": str(batch),
            "mean_abs_logprob_diff": 0.0,
            "n_tokens": 1,
        },
        headers=run.headers,
    )
    assert mismatch.status_code == 422


def test_metrics_round_trip_with_since_step(app, client, admin_headers) -> None:
    run = make_run(app)
    fencing = attach(client, run)["fencing"]
    points = [{"step": s, "version": s // 2, "values": {"loss": 1.0 / (s + 1)}} for s in range(5)]
    stored = client.post(
        run.url("metrics"), json={"fencing": fencing, "points": points}, headers=run.headers
    )
    assert stored.status_code == 200 and stored.json()["stored"] == 5
    body = client.get(run.url("metrics"), headers=admin_headers).json()
    assert [(p["step"], p["values"]["loss"]) for p in body["learner"]] == [
        (p["step"], p["values"]["loss"]) for p in points
    ]
    since = client.get(run.url("metrics"), params={"since_step": 3}, headers=admin_headers)
    assert [p["step"] for p in since.json()["learner"]] == [3, 4]
    assert since.json()["proxy"]["samples_generated"] == 0


def test_claim_long_polls_without_holding_a_transaction(pg_url, tmp_path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from fastapi.testclient import TestClient
    from sqlalchemy import create_engine, text

    from server.app import create_app
    from tests.conftest import make_settings

    settings = make_settings(pg_url, tmp_path / "b").model_copy(update={"lease_long_poll_s": 1.5})
    app = create_app(settings, migrate=True)
    probe = create_engine(pg_url)
    try:
        with TestClient(app) as client, ThreadPoolExecutor(1) as pool:
            run = make_run(app)
            fencing = attach(client, run)["fencing"]
            start = time.monotonic()
            future = pool.submit(
                client.post,
                run.url("batches/claim"),
                json={"fencing": fencing, "max_groups": 2, "wait_s": 30},
                headers=run.headers,
            )
            time.sleep(1.0)
            # A transaction held across the wait would have started about a second ago.
            with probe.connect() as conn:
                long_tx = conn.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                        " AND pid <> pg_backend_pid()"
                        " AND xact_start < clock_timestamp() - interval '0.6 seconds'"
                    )
                ).scalar()
            body = future.result(timeout=30).json()
            waited = time.monotonic() - start
        assert long_tx == 0
        assert body["batches"] == [] and body["exhausted"] is False
        assert 1.4 <= waited < 6.0  # capped by the server's lease_long_poll_s
    finally:
        probe.dispose()
        app.state.engine.dispose()
