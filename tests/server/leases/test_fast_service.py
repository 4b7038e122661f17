"""The worker calls' common case on the event loop (Postgres): which path answered each call,
and that it writes exactly what the portable path writes for the same cycle."""

from __future__ import annotations

import contextlib
import functools
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from server.db_types import db_now_plus
from server.models import Lease, PromptRow, RolloutBatch, Run, Worker
from tests.conftest import make_settings, terminate_other_backends
from tests.server.leases.helpers import batch_manifest, make_run, make_worker, snapshot

pytestmark = pytest.mark.postgres

BASE = "/api/v1/leases"


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def apps(pg_url: str, tmp_path: Path) -> Iterator[dict[bool, tuple[FastAPI, TestClient]]]:
    """Two servers on one database and one bucket: common case on the event loop, or not."""
    from server.app import create_app

    made: dict[bool, tuple[FastAPI, TestClient]] = {}
    with contextlib.ExitStack() as stack:
        for on_event_loop in (True, False):
            settings = make_settings(
                pg_url, tmp_path / "bucket", worker_calls_on_event_loop=on_event_loop
            )
            app = create_app(settings, migrate=True)
            stack.callback(app.state.engine.dispose)
            made[on_event_loop] = (app, stack.enter_context(TestClient(app)))
        yield made


def _arrange(app: FastAPI, **config: Any) -> tuple[Run, uuid.UUID, str]:
    """A running run (its config parsed by this process, as once any call has read it) and a
    worker with its token."""
    from server.runs.service import config_of

    with app.state.sessionmaker() as db:
        run = make_run(db, **config)
        worker, token = make_worker(db)
        db.commit()
        config_of(db, run.id)
    return run, worker.id, token


def _cycle(app: FastAPI, client: TestClient, token: str) -> dict[str, Any]:
    """acquire → heartbeat → upload (and the PUT) → complete; the lease and the answers."""
    lease = client.post(f"{BASE}/acquire", json={}, headers=_h(token)).json()
    path, fencing = f"{BASE}/{lease['lease_id']}", lease["fencing"]
    beat = client.post(f"{path}/heartbeat", json={"fencing": fencing}, headers=_h(token))
    data = b"the same batch bytes on both paths"
    manifest = batch_manifest(lease, data, n_tokens=77, generation_seconds=2.5)
    put = client.post(
        f"{path}/upload",
        json={"fencing": fencing, "size": len(data), "sha256": manifest["sha256"]},
        headers=_h(token),
    )
    app.state.store.put_bytes(lease["batch_key"], data, if_none_match=True)
    done = client.post(
        f"{path}/complete", json={"fencing": fencing, "manifest": manifest}, headers=_h(token)
    )
    return {"lease": lease, "heartbeat": beat.json(), "upload": put.json(), "done": done.json()}


def _written(db: Session, cycle: dict[str, Any], worker_id: uuid.UUID) -> dict[str, Any]:
    """What the cycle left in the database, without ids and times."""
    db.expire_all()
    lease_id = uuid.UUID(cycle["lease"]["lease_id"])
    lease = db.get(Lease, lease_id)
    batch = db.get(RolloutBatch, uuid.UUID(cycle["done"]["batch_id"]))
    worker = db.get(Worker, worker_id)
    assert lease is not None and batch is not None and worker is not None
    rows = db.execute(
        select(PromptRow.state, PromptRow.attempts).where(PromptRow.batch_id == batch.id)
    )
    written = {
        "lease": (lease.state, lease.end_reason, lease.ended_at is not None,
                  lease.last_heartbeat_at is not None, lease.n_prompts, lease.adapter_version),
        "batch": {name: getattr(batch, name) for name in (
            "state", "reject_reason", "adapter_version", "sha256", "bytes", "n_samples",
            "n_tokens", "n_groups", "tokenizer_fingerprint", "generation_seconds")},
        "batch_key_matches": batch.bucket_key == cycle["lease"]["batch_key"],
        "manifest_n_tokens": (batch.manifest or {}).get("n_tokens"),
        "rows": sorted(rows.all()),
        "worker": (worker.accepted_batches, worker.rejected_batches,
                   worker.last_seen_at is not None),
    }  # fmt: skip
    db.commit()
    return written


def test_common_case_runs_on_the_event_loop_and_writes_what_the_portable_path_writes(
    apps: dict[bool, tuple[FastAPI, TestClient]],
) -> None:
    fast_app, fast_client = apps[True]
    portable_app, portable_client = apps[False]
    run, fast_worker_id, fast_token = _arrange(fast_app, n_rows=8, prompts_per_lease=2)
    with fast_app.state.sessionmaker() as db:
        db.execute(update(Run).where(Run.id == run.id).values(tokenizer_fingerprint="tok-1"))
        portable_worker, portable_token = make_worker(db, name="portable")
        db.commit()
    portable = _cycle(portable_app, portable_client, portable_token)
    fast = _cycle(fast_app, fast_client, fast_token)

    assert portable_app.state.call_paths == {
        (call, "portable"): 1 for call in ("acquire", "heartbeat", "upload", "complete")
    }
    assert fast_app.state.call_paths == {
        (call, "event_loop"): 1 for call in ("acquire", "heartbeat", "upload", "complete")
    }
    assert fast["done"]["state"] == portable["done"]["state"] == "accepted"
    assert fast["heartbeat"] == portable["heartbeat"]
    assert set(fast["upload"]) == set(portable["upload"])
    assert set(fast["lease"]) == set(portable["lease"])
    assert fast["lease"]["fencing"] == portable["lease"]["fencing"] + 1
    with fast_app.state.sessionmaker() as db:
        assert _written(db, fast, fast_worker_id) == _written(db, portable, portable_worker.id)
        assert _written(db, fast, fast_worker_id)["rows"] == [("accepted", 0)] * 2


def test_what_is_not_the_common_case_is_answered_on_the_portable_path(
    apps: dict[bool, tuple[FastAPI, TestClient]],
) -> None:
    app, client = apps[True]
    run, _, token = _arrange(app, n_rows=8, max_staleness=0)
    lease = client.post(f"{BASE}/acquire", json={}, headers=_h(token)).json()
    path, fencing = f"{BASE}/{lease['lease_id']}", lease["fencing"]

    # No token: refused before any query, on the event loop.
    assert client.post(f"{path}/heartbeat", json={"fencing": fencing}).status_code == 401
    # Another worker's lease: the portable path says 404.
    with app.state.sessionmaker() as db:
        _, stranger = make_worker(db, name="stranger")
        db.commit()
    answer = client.post(f"{path}/heartbeat", json={"fencing": fencing}, headers=_h(stranger))
    assert answer.status_code == 404
    # The lease's version fell out of the window: the portable path aborts it.
    with app.state.sessionmaker() as db:
        db.execute(update(Run).where(Run.id == run.id).values(current_version=1))
        db.commit()
    answer = client.post(f"{path}/heartbeat", json={"fencing": fencing}, headers=_h(token))
    assert answer.json()["abort"] is True and answer.json()["reason"] == "stale"
    assert app.state.call_paths[("heartbeat", "portable")] == 2
    assert app.state.call_paths[("heartbeat", "event_loop")] == 1


def test_expired_leases_are_swept_by_the_portable_acquire(
    apps: dict[bool, tuple[FastAPI, TestClient]],
) -> None:
    app, client = apps[True]
    _, _, token = _arrange(app, n_rows=8)
    first = client.post(f"{BASE}/acquire", json={}, headers=_h(token)).json()
    assert app.state.call_paths[("acquire", "event_loop")] == 1
    with app.state.sessionmaker() as db:
        db.execute(
            update(Lease)
            .where(Lease.id == uuid.UUID(first["lease_id"]))
            .values(expires_at=db_now_plus(-1.0))
        )
        db.commit()
    second = client.post(f"{BASE}/acquire", json={}, headers=_h(token)).json()
    assert app.state.call_paths[("acquire", "portable")] == 1
    # The sweep re-queued the expired lease's rows at the front: the new lease has them.
    assert [p["prompt_row_id"] for p in second["prompts"]] == [
        p["prompt_row_id"] for p in first["prompts"]
    ]
    with app.state.sessionmaker() as db:
        assert db.get(Lease, uuid.UUID(first["lease_id"])).state == "expired"  # type: ignore[union-attr]


def test_lost_fencing_on_the_event_loop_is_409_and_changes_nothing(
    apps: dict[bool, tuple[FastAPI, TestClient]],
) -> None:
    app, client = apps[True]
    run, _, token = _arrange(app, n_rows=8)
    lease = client.post(f"{BASE}/acquire", json={}, headers=_h(token)).json()
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
        answer = client.post(f"{path}/{op}", json={"fencing": wrong, **body}, headers=_h(token))
        assert answer.status_code == 409, (op, answer.text)
    with app.state.sessionmaker() as db:
        assert snapshot(db, run.id) == before


def test_a_restarted_database_is_one_503_then_the_event_loop_path_recovers(
    pg_url: str, apps: dict[bool, tuple[FastAPI, TestClient]]
) -> None:
    app, client = apps[True]
    _, _, token = _arrange(app, n_rows=8)
    lease = client.post(f"{BASE}/acquire", json={}, headers=_h(token)).json()
    path, body = f"{BASE}/{lease['lease_id']}/heartbeat", {"fencing": lease["fencing"]}
    assert client.post(path, json=body, headers=_h(token)).status_code == 200
    pool = app.state.pg_pool
    client.portal.call(functools.partial(pool.resize, 4))  # four idle connections to lose
    client.portal.call(pool.wait)
    assert terminate_other_backends(pg_url) >= 1
    failed = client.post(path, json=body, headers=_h(token))
    assert failed.status_code == 503 and failed.headers["Retry-After"] == "1"
    assert client.post(path, json=body, headers=_h(token)).status_code == 200
    assert app.state.call_paths[("heartbeat", "event_loop")] == 3
