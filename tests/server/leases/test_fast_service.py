"""The worker calls' common case on the event loop (Postgres): which path answered each call,
and that it answers and writes exactly what the portable path does for the same cycle."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import update

from server.db_types import db_now_plus
from server.leases.paths import EVENT_LOOP, PORTABLE
from server.models import Lease, Run
from tests.conftest import make_settings, terminate_other_backends
from tests.server.leases.helpers import batch_manifest, make_run, make_worker, snapshot
from tests.server.leases.twins import BASE, Outcome, Sent, Servers, Side, bearer, empty, send

pytestmark = pytest.mark.postgres

CYCLE = ("acquire", "heartbeat", "upload", "complete")
BATCH = b"the same batch bytes on both paths"


@pytest.fixture
def served(pg_url: str, tmp_path: Path) -> Iterator[tuple[FastAPI, TestClient]]:
    """A server answering the common case on the event loop."""
    from server.app import create_app

    settings = make_settings(pg_url, tmp_path / "bucket", worker_calls_on_event_loop=True)
    app = create_app(settings, migrate=True)
    with TestClient(app) as client:
        yield app, client
    app.state.engine.dispose()


def _arrange(app: FastAPI, **config: Any) -> tuple[Run, uuid.UUID, str]:
    """A running run (its config parsed by this process, as create_run leaves it) and a
    worker with its token."""
    with app.state.sessionmaker() as db:
        run = make_run(db, **config)
        worker, token = make_worker(db)
        db.commit()
    return run, worker.id, token


def _cycle(side: Side) -> dict[str, Outcome]:
    """A worker's whole lease: acquire, heartbeat, upload (then the PUT through its URL) and
    complete, on a run with a tokenizer fingerprint; each call's outcome."""
    side.run(n_rows=8, prompts_per_lease=2)
    side.execute(update(Run).values(tokenizer_fingerprint="tok-1"))
    headers = bearer(side.worker())
    done = {"acquire": send(side, Sent(f"{BASE}/acquire", {}, headers))}
    lease = done["acquire"].raw
    path, fencing = f"{BASE}/{lease['lease_id']}", lease["fencing"]
    done["heartbeat"] = send(side, Sent(f"{path}/heartbeat", {"fencing": fencing}, headers))
    manifest = batch_manifest(lease, BATCH, n_tokens=77, generation_seconds=2.5)
    upload = {"fencing": fencing, "size": len(BATCH), "sha256": manifest["sha256"]}
    done["upload"] = send(side, Sent(f"{path}/upload", upload, headers))
    put = done["upload"].raw
    assert side.client.put(put["url"], content=BATCH, headers=put["headers"]).status_code == 200
    complete = {"fencing": fencing, "manifest": manifest}
    done["complete"] = send(side, Sent(f"{path}/complete", complete, headers))
    return done


def test_common_case_runs_on_the_event_loop_and_writes_what_the_portable_path_writes(
    servers: Servers,
) -> None:
    """The same cycle on two databases arranged the same way: after each call, the same whole
    answer and the same whole rows (ids and times normalised: tests/server/leases/rows.py)."""
    namespace = uuid.uuid4()
    cycles = {}
    for path, (app, client) in servers.items():
        empty(app)
        cycles[path] = _cycle(Side(app, client, namespace))

    for call in CYCLE:
        fast, portable = cycles[EVENT_LOOP][call], cycles[PORTABLE][call]
        assert portable.status == 200, portable.body
        assert (fast.status, fast.body) == (portable.status, portable.body), call
        assert fast.rows == portable.rows, call
        assert fast.changed and portable.changed, call
        assert portable.paths == {(call, PORTABLE): 1}
        assert fast.paths == {(call, EVENT_LOOP): 1}
    # What both wrote is what the cycle must write.
    beat = cycles[PORTABLE]["heartbeat"]
    assert [lease["lifetime_s"] for lease in beat.rows["leases"]] == [60.0]  # the run's TTL
    done = cycles[PORTABLE]["complete"]
    batch = "batch:lease:run:run#1"
    assert done.body == {"batch_id": batch, "state": "accepted", "reject_reason": None}
    assert [
        (row["state"], row["attempts"]) for row in done.rows["prompt_rows"] if row["batch_id"]
    ] == [("accepted", 0)] * 2
    (written,) = done.rows["rollout_batches"]
    assert (written["id"], written["n_tokens"], written["tokenizer_fingerprint"]) == (
        batch,
        77,
        "tok-1",
    )


def test_what_is_not_the_common_case_is_answered_on_the_portable_path(
    served: tuple[FastAPI, TestClient],
) -> None:
    app, client = served
    run, _, token = _arrange(app, n_rows=8, max_staleness=0)
    lease = client.post(f"{BASE}/acquire", json={}, headers=bearer(token)).json()
    path, fencing = f"{BASE}/{lease['lease_id']}", lease["fencing"]

    # No token: refused before any query, on the event loop.
    assert client.post(f"{path}/heartbeat", json={"fencing": fencing}).status_code == 401
    # Another worker's lease: the portable path says 404.
    with app.state.sessionmaker() as db:
        _, stranger = make_worker(db, name="stranger")
        db.commit()
    answer = client.post(f"{path}/heartbeat", json={"fencing": fencing}, headers=bearer(stranger))
    assert answer.status_code == 404
    # The lease's version fell out of the window: the portable path aborts it.
    with app.state.sessionmaker() as db:
        db.execute(update(Run).where(Run.id == run.id).values(current_version=1))
        db.commit()
    answer = client.post(f"{path}/heartbeat", json={"fencing": fencing}, headers=bearer(token))
    assert answer.json()["abort"] is True and answer.json()["reason"] == "stale"
    assert app.state.call_paths[("heartbeat", "portable")] == 2
    assert app.state.call_paths[("heartbeat", "event_loop")] == 1


def test_expired_leases_are_swept_by_the_portable_acquire(
    served: tuple[FastAPI, TestClient],
) -> None:
    app, client = served
    _, _, token = _arrange(app, n_rows=8)
    first = client.post(f"{BASE}/acquire", json={}, headers=bearer(token)).json()
    assert app.state.call_paths[("acquire", "event_loop")] == 1
    with app.state.sessionmaker() as db:
        db.execute(
            update(Lease)
            .where(Lease.id == uuid.UUID(first["lease_id"]))
            .values(expires_at=db_now_plus(-1.0))
        )
        db.commit()
    second = client.post(f"{BASE}/acquire", json={}, headers=bearer(token)).json()
    assert app.state.call_paths[("acquire", "portable")] == 1
    # The sweep re-queued the expired lease's rows at the front: the new lease has them.
    assert [p["prompt_row_id"] for p in second["prompts"]] == [
        p["prompt_row_id"] for p in first["prompts"]
    ]
    with app.state.sessionmaker() as db:
        assert db.get(Lease, uuid.UUID(first["lease_id"])).state == "expired"  # type: ignore[union-attr]


def test_lost_fencing_on_the_event_loop_is_409_and_changes_nothing(
    served: tuple[FastAPI, TestClient],
) -> None:
    app, client = served
    run, _, token = _arrange(app, n_rows=8)
    lease = client.post(f"{BASE}/acquire", json={}, headers=bearer(token)).json()
    path, wrong = f"{BASE}/{lease['lease_id']}", lease["fencing"] + 1
    with app.state.sessionmaker() as db:
        before = snapshot(db, run.id)
    data = b"x" * 10
    manifest = batch_manifest(lease, data)
    app.state.store.put_bytes(lease["batch_key"], data)
    for op, body in (
        ("heartbeat", {}),
        ("upload", {"size": len(data), "sha256": manifest["sha256"]}),
        ("complete", {"manifest": manifest}),
    ):
        answer = client.post(f"{path}/{op}", json={"fencing": wrong, **body}, headers=bearer(token))
        assert answer.status_code == 409, (op, answer.text)
    with app.state.sessionmaker() as db:
        assert snapshot(db, run.id) == before


def test_a_restarted_database_is_one_503_then_the_event_loop_path_recovers(
    pg_url: str, served: tuple[FastAPI, TestClient]
) -> None:
    app, client = served
    _, _, token = _arrange(app, n_rows=8)
    lease = client.post(f"{BASE}/acquire", json={}, headers=bearer(token)).json()
    path, body = f"{BASE}/{lease['lease_id']}/heartbeat", {"fencing": lease["fencing"]}
    assert client.post(path, json=body, headers=bearer(token)).status_code == 200
    pool = app.state.pg_pool
    client.portal.call(functools.partial(pool.resize, 4))  # four idle connections to lose
    client.portal.call(pool.wait)
    assert terminate_other_backends(pg_url) >= 1
    failed = client.post(path, json=body, headers=bearer(token))
    assert failed.status_code == 503 and failed.headers["Retry-After"] == "1"
    assert client.post(path, json=body, headers=bearer(token)).status_code == 200
    assert app.state.call_paths[("heartbeat", "event_loop")] == 3
