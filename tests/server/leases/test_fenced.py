"""Fenced worker calls: heartbeat, upload, complete, release (invariants 2, 4, 6, 10)."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from protocol import layout
from server.db_types import db_now, db_now_plus
from server.models import Lease, PromptRow, RolloutBatch, Run, Worker
from tests.conftest import terminate_other_backends
from tests.server.leases.helpers import (
    acquire_lease,
    batch_manifest,
    bearer,
    in_flight,
    make_run,
    make_worker,
    snapshot,
)
from tests.server.leases.lease_paths import POSTGRES, SQLITE, Answered, LeasePath
from tests.server.leases.twins import Outcome, Sent, Servers, Side, empty, send

BASE = "/api/v1/leases"


def _call(client: TestClient, token: str, lease: dict[str, Any], op: str, **body: Any) -> Any:
    return client.post(
        f"{BASE}/{lease['lease_id']}/{op}",
        json={"fencing": lease["fencing"], **body},
        headers=bearer(token),
    )


def _row_states(db: Session, ids: list[int]) -> list[tuple[str, int]]:
    db.expire_all()
    rows = db.execute(select(PromptRow).where(PromptRow.id.in_(ids)).order_by(PromptRow.id))
    states = [(r.state, r.attempts) for r in rows.scalars()]
    db.commit()  # end the read transaction (SQLite has one writer)
    return states


def _front(db: Session, run_id: uuid.UUID, n: int) -> list[int]:
    db.expire_all()
    ids = list(
        db.execute(
            select(PromptRow.id)
            .where(PromptRow.run_id == run_id, PromptRow.state == "queued")
            .order_by(PromptRow.queue_pos)
            .limit(n)
        ).scalars()
    )
    db.commit()
    return ids


def _expire(db: Session, lease_id: str) -> None:
    """Let database time pass the lease's expiry."""
    db.execute(
        update(Lease).where(Lease.id == uuid.UUID(lease_id)).values(expires_at=db_now_plus(-1.0))
    )
    db.commit()


def test_heartbeat_extends_by_the_runs_ttl(
    lease_client: TestClient, db: Session, answered: Answered
) -> None:
    make_run(db, n_rows=4, lease_ttl_s=300.0, heartbeat_interval_s=5.0)
    _, token = make_worker(db)
    db.commit()
    lease = acquire_lease(lease_client, token)
    db.execute(
        update(Lease)
        .where(Lease.id == uuid.UUID(lease["lease_id"]))
        .values(expires_at=db_now_plus(2.0))
    )
    db.commit()
    answer = _call(lease_client, token, lease, "heartbeat")
    assert answer.status_code == 200
    assert answer.json() == {"current_version": 0, "abort": False, "ttl_s": 300.0, "reason": None}
    db.expire_all()
    row = db.get(Lease, uuid.UUID(lease["lease_id"]))
    assert row is not None and row.last_heartbeat_at is not None
    remaining = (row.expires_at - db.execute(select(db_now())).scalar_one()).total_seconds()
    assert 290 < remaining <= 300
    answered.expect({"acquire": 1, "heartbeat": 1})


def test_stale_heartbeat_aborts_and_requeues_at_the_front(
    lease_client: TestClient, db: Session, answered: Answered
) -> None:
    run = make_run(db, n_rows=6, max_staleness=1)
    _, token = make_worker(db)
    db.commit()
    lease = acquire_lease(lease_client, token)
    ids = [p["prompt_row_id"] for p in lease["prompts"]]
    db.execute(update(Run).where(Run.id == run.id).values(current_version=1))
    db.commit()
    ok = _call(lease_client, token, lease, "heartbeat").json()
    assert ok["abort"] is False and ok["current_version"] == 1  # 1 behind: still admissible
    db.execute(update(Run).where(Run.id == run.id).values(current_version=2))
    db.commit()
    answer = _call(lease_client, token, lease, "heartbeat").json()
    assert answer["abort"] is True and answer["current_version"] == 2
    db.expire_all()
    assert db.get(Lease, uuid.UUID(lease["lease_id"])).state == "aborted"  # type: ignore[union-attr]
    assert _front(db, run.id, 2) == ids
    assert _row_states(db, ids) == [("queued", 1), ("queued", 1)]
    db.refresh(run)
    assert run.groups_in_flight == in_flight(db, run.id) == 0
    db.commit()
    assert _call(lease_client, token, lease, "heartbeat").status_code == 409
    # The beat that aborts and the one refused 409 are counted like any other.
    answered.expect({"acquire": 1, "heartbeat": 1 + 2})


def test_paused_run_aborts_without_counting_an_attempt(
    lease_client: TestClient, db: Session
) -> None:
    run = make_run(db, n_rows=4)
    _, token = make_worker(db)
    db.commit()
    lease = acquire_lease(lease_client, token)
    ids = [p["prompt_row_id"] for p in lease["prompts"]]
    db.execute(update(Run).where(Run.id == run.id).values(status="paused"))
    db.commit()
    answer = _call(lease_client, token, lease, "heartbeat").json()
    assert answer["abort"] is True and answer["reason"] == "run_paused"
    assert _row_states(db, ids) == [("queued", 0), ("queued", 0)]


def test_another_workers_lease_is_404_and_changes_nothing(
    lease_client: TestClient, db: Session
) -> None:
    run = make_run(db, n_rows=4)
    _, owner = make_worker(db, name="owner")
    _, other = make_worker(db, name="other")
    db.commit()
    lease = acquire_lease(lease_client, owner)
    before = snapshot(db, run.id)
    data = b"x" * 10
    for op, body in [
        ("heartbeat", {}),
        ("upload", {"size": 10, "sha256": "0" * 64}),
        ("complete", {"manifest": batch_manifest(lease, data)}),
        ("release", {}),
    ]:
        assert _call(lease_client, other, lease, op, **body).status_code == 404, op
    missing = {"lease_id": str(uuid.uuid4()), "fencing": 1}
    assert _call(lease_client, owner, missing, "heartbeat").status_code == 404
    assert snapshot(db, run.id) == before


def test_upload_then_complete_accepts(  # type: ignore[no-untyped-def]
    lease_client: TestClient, lease_app, db: Session, answered: Answered
) -> None:
    run = make_run(db, n_rows=4)
    worker, token = make_worker(db)
    db.commit()
    lease = acquire_lease(lease_client, token)
    data = b"parquet-bytes" * 10
    sha = hashlib.sha256(data).hexdigest()
    put = _call(lease_client, token, lease, "upload", size=len(data), sha256=sha)
    assert put.status_code == 200, put.text
    assert put.json()["key"] == lease["batch_key"] and put.json()["url"]
    lease_app.state.store.put_bytes(lease["batch_key"], data, if_none_match=True)
    done = _call(lease_client, token, lease, "complete", manifest=batch_manifest(lease, data))
    assert done.status_code == 200, done.text
    assert done.json()["state"] == "accepted" and done.json()["reject_reason"] is None
    batch_id = uuid.UUID(done.json()["batch_id"])
    ids = [p["prompt_row_id"] for p in lease["prompts"]]
    db.expire_all()
    rows = db.execute(select(PromptRow).where(PromptRow.id.in_(ids))).scalars().all()
    assert {(r.state, r.batch_id) for r in rows} == {("accepted", batch_id)}
    batch = db.get(RolloutBatch, batch_id)
    assert batch is not None and batch.state == "accepted" and batch.sha256 == sha
    assert (batch.bytes, batch.n_groups, batch.adapter_version) == (len(data), 2, 0)
    assert db.get(Lease, uuid.UUID(lease["lease_id"])).state == "completed"  # type: ignore[union-attr]
    assert db.get(Worker, worker.id).accepted_batches == 1  # type: ignore[union-attr]
    db.refresh(run)
    assert run.groups_in_flight == 2  # accepted groups stay in flight until consumed
    db.commit()
    again = _call(lease_client, token, lease, "complete", manifest=batch_manifest(lease, data))
    assert again.status_code == 409
    answered.expect({"acquire": 1, "upload": 1, "complete": 1 + 1})


def _rejected(
    client: TestClient, app, db: Session, *, put: bytes | None, **manifest: Any
) -> tuple[dict[str, Any], list[int], Run]:  # type: ignore[no-untyped-def]
    run = make_run(db, n_rows=4)
    _, token = make_worker(db)
    db.commit()
    lease = acquire_lease(client, token)
    if put is not None:
        app.state.store.put_bytes(lease["batch_key"], put)
    answer = _call(
        client, token, lease, "complete", manifest=batch_manifest(lease, b"y" * 50, **manifest)
    )
    assert answer.status_code == 200, answer.text
    return answer.json(), [p["prompt_row_id"] for p in lease["prompts"]], run


def test_complete_without_the_object_is_rejected_and_requeued(
    lease_client: TestClient,
    lease_app,  # type: ignore[no-untyped-def]
    db: Session,
    answered: Answered,
) -> None:
    answer, ids, run = _rejected(lease_client, lease_app, db, put=None)
    assert (answer["state"], answer["reject_reason"]) == ("rejected", "missing_object")
    assert _front(db, run.id, 2) == ids
    assert _row_states(db, ids) == [("queued", 1), ("queued", 1)]
    db.refresh(run)
    assert run.groups_in_flight == 0
    answered.expect({"acquire": 1, "complete": 1})


def test_complete_with_a_wrong_size_or_count_is_rejected(
    lease_client: TestClient,
    lease_app,
    db: Session,  # type: ignore[no-untyped-def]
) -> None:
    answer, ids, _ = _rejected(lease_client, lease_app, db, put=b"short")
    assert answer["reject_reason"] == "size_mismatch"
    answer, ids, _ = _rejected(lease_client, lease_app, db, put=b"y" * 50, n_samples=3)
    assert answer["reject_reason"] == "invalid"
    assert _row_states(db, ids) == [("queued", 1), ("queued", 1)]


def test_complete_naming_another_key_is_422_and_changes_nothing(
    lease_client: TestClient, db: Session
) -> None:
    run = make_run(db, n_rows=4)
    _, token = make_worker(db)
    db.commit()
    lease = acquire_lease(lease_client, token)
    other_key = layout.adapter_key(run.id, 1, "adapter_model.safetensors")
    before = snapshot(db, run.id)  # expires `run`: no attribute reads until the call is done
    bad = batch_manifest(lease, b"z", key=other_key)
    answer = _call(lease_client, token, lease, "complete", manifest=bad)
    assert answer.status_code == 422
    assert snapshot(db, run.id) == before


def test_release_puts_rows_back_without_an_attempt(
    lease_client: TestClient, db: Session, answered: Answered
) -> None:
    run = make_run(db, n_rows=6)
    _, token = make_worker(db)
    db.commit()
    lease = acquire_lease(lease_client, token)
    ids = [p["prompt_row_id"] for p in lease["prompts"]]
    answer = _call(lease_client, token, lease, "release")
    assert answer.status_code == 200 and answer.json() == {"released": 2}
    assert _front(db, run.id, 2) == ids
    assert _row_states(db, ids) == [("queued", 0), ("queued", 0)]
    assert _call(lease_client, token, lease, "release").status_code == 409
    again = acquire_lease(lease_client, token)
    assert [p["prompt_row_id"] for p in again["prompts"]] == ids
    answered.expect({"acquire": 2, "release": 2})


def test_release_with_a_reason_records_it_and_engine_faults_count_attempts(
    lease_client: TestClient, db: Session, answered: Answered
) -> None:
    """A worker says why it gives a lease back; only an engine fault counts an attempt, so a
    prompt that kills engines every time is dropped after max_attempts (3 here) and its epoch
    still closes."""
    run = make_run(db, n_rows=2)
    _, token = make_worker(db)
    db.commit()
    lease = acquire_lease(lease_client, token)
    ids = [p["prompt_row_id"] for p in lease["prompts"]]
    assert _call(lease_client, token, lease, "release", reason="shutdown").status_code == 200
    assert _row_states(db, ids) == [("queued", 0), ("queued", 0)]
    for attempt in (1, 2, 3):
        lease = acquire_lease(lease_client, token)
        assert [p["prompt_row_id"] for p in lease["prompts"]] == ids
        answer = _call(lease_client, token, lease, "release", reason="engine_fault")
        assert answer.status_code == 200, answer.text
        if attempt < 3:
            assert _row_states(db, ids) == [("queued", attempt)] * 2
    db.expire_all()
    leases = db.execute(
        select(Lease.end_reason).where(Lease.run_id == run.id).order_by(Lease.fencing)
    ).scalars()
    assert list(leases) == ["shutdown", "engine_fault", "engine_fault", "engine_fault"]
    rows = db.execute(
        select(PromptRow.state, PromptRow.attempts, PromptRow.drop_reason).where(
            PromptRow.id.in_(ids)
        )
    ).all()
    db.commit()
    assert [tuple(r) for r in rows] == [("dropped", 3, "engine_fault_exhausted")] * 2
    assert in_flight(db, run.id) == 0
    answered.expect({"acquire": 4, "release": 4})


def test_release_refuses_an_unknown_reason(
    lease_client: TestClient, db: Session, answered: Answered
) -> None:
    run = make_run(db, n_rows=2)
    _, token = make_worker(db)
    db.commit()
    lease = acquire_lease(lease_client, token)
    before = snapshot(db, run.id)
    answer = _call(lease_client, token, lease, "release", reason="bored")
    assert answer.status_code == 422
    assert answer.json()["errors"][0]["field"] == "reason"
    assert snapshot(db, run.id) == before
    answered.expect({"acquire": 1})


def test_expired_and_reissued_lease_fences_out_the_old_holder(
    lease_client: TestClient,
    lease_app,  # type: ignore[no-untyped-def]
    db: Session,
    answered: Answered,
) -> None:
    run = make_run(db, n_rows=6)
    _, old_token = make_worker(db, name="old")
    _, new_token = make_worker(db, name="new")
    db.commit()
    old = acquire_lease(lease_client, old_token)
    _expire(db, old["lease_id"])
    new = acquire_lease(lease_client, new_token)  # sweeps the expired lease; same rows, re-issued
    assert [p["prompt_row_id"] for p in new["prompts"]] == [
        p["prompt_row_id"] for p in old["prompts"]
    ]
    assert new["fencing"] > old["fencing"] and new["lease_id"] != old["lease_id"]
    swept = db.execute(select(Lease.state).where(Lease.id == uuid.UUID(old["lease_id"])))
    assert swept.scalar_one() == "expired"
    db.commit()
    data = b"late batch"
    lease_app.state.store.put_bytes(old["batch_key"], data)
    before = snapshot(db, run.id)
    sha = hashlib.sha256(data).hexdigest()
    for op, body in [
        ("heartbeat", {}),
        ("upload", {"size": len(data), "sha256": sha}),
        ("complete", {"manifest": batch_manifest(old, data)}),
        ("release", {}),
    ]:
        assert _call(lease_client, old_token, old, op, **body).status_code == 409, op
    assert snapshot(db, run.id) == before
    assert _call(lease_client, new_token, new, "heartbeat").json()["abort"] is False
    lease_app.state.store.put_bytes(new["batch_key"], data)
    done = _call(lease_client, new_token, new, "complete", manifest=batch_manifest(new, data))
    assert done.json()["state"] == "accepted"
    ids = [p["prompt_row_id"] for p in new["prompts"]]
    assert _row_states(db, ids) == [("accepted", 1), ("accepted", 1)]
    answered.expect(
        # The second acquire sweeps the expired lease; the old holder's calls are all refused.
        {"acquire": 2, "heartbeat": 2, "upload": 1, "complete": 2, "release": 1},
    )


def test_rows_are_dropped_after_max_attempts(lease_client: TestClient, db: Session) -> None:
    run = make_run(db, n_rows=2, max_attempts=2)
    _, token = make_worker(db)
    db.commit()
    for _ in range(2):
        lease = acquire_lease(lease_client, token)
        _expire(db, lease["lease_id"])
    assert lease_client.post(f"{BASE}/acquire", json={}, headers=bearer(token)).status_code == 204
    db.expire_all()
    rows = db.execute(select(PromptRow).where(PromptRow.run_id == run.id)).scalars().all()
    assert {(r.state, r.drop_reason, r.attempts) for r in rows} == {
        ("dropped", "expired_exhausted", 2)
    }
    db.refresh(run)
    assert run.groups_in_flight == 0


CYCLE = ("acquire", "heartbeat", "upload", "complete")
BATCH = b"the same batch bytes on both databases"


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


@pytest.mark.postgres
def test_a_whole_lease_writes_the_same_on_both_databases(servers: Servers) -> None:
    """The same cycle on Postgres and SQLite arranged the same way (the grant, the heartbeat
    and the accept are each written once per database: server/leases/statements.py): after
    each call, the same whole answer and the same whole rows (ids and times normalised:
    tests/server/leases/rows.py), each call counted once; and what both wrote is what the
    cycle must write."""
    namespace = uuid.uuid4()
    cycles = {}
    for database, (app, client) in servers.items():
        empty(app)
        cycles[database] = _cycle(Side(app, client, namespace))

    for call in CYCLE:
        postgres, sqlite = cycles[POSTGRES][call], cycles[SQLITE][call]
        assert postgres.status == 200, postgres.body
        assert (sqlite.status, sqlite.body) == (postgres.status, postgres.body), call
        assert sqlite.rows == postgres.rows, call
        assert postgres.changed and sqlite.changed, call
        assert postgres.calls == sqlite.calls == {call: 1}
    granted = cycles[POSTGRES]["acquire"]
    assert [lease["lifetime_s"] for lease in granted.rows["leases"]] == [60.0]  # the run's TTL
    (seen,) = granted.rows["workers"]
    assert (seen["last_seen_at"], seen["waiting_since"]) == ("written", None)  # a grant clears it
    beat = cycles[POSTGRES]["heartbeat"]
    assert [lease["lifetime_s"] for lease in beat.rows["leases"]] == [60.0]
    assert beat.body == {"current_version": 0, "abort": False, "ttl_s": 60.0, "reason": None}
    done = cycles[POSTGRES]["complete"]
    batch = "batch:lease:run:run#1"
    assert done.body == {"batch_id": batch, "state": "accepted", "reject_reason": None}
    assert [
        (row["state"], row["attempts"]) for row in done.rows["prompt_rows"] if row["batch_id"]
    ] == [("accepted", 0)] * 2
    (lease,) = done.rows["leases"]
    assert (lease["state"], lease["end_reason"], lease["ended_at"]) == (
        "completed",
        "completed",
        "written",
    )
    (written,) = done.rows["rollout_batches"]
    assert (
        written["id"],
        written["state"],
        written["n_tokens"],
        written["n_groups"],
        written["generation_seconds"],
        written["tokenizer_fingerprint"],
    ) == (batch, "accepted", 77, 2, 2.5, "tok-1")
    (worker,) = done.rows["workers"]
    assert worker["accepted_batches"] == 1


@pytest.mark.parametrize(
    "lease_path", [pytest.param(POSTGRES, marks=pytest.mark.postgres)], indirect=True
)
def test_a_restarted_database_is_one_503_then_the_worker_calls_recover(
    lease_client: TestClient, db: Session, lease_path: LeasePath, answered: Answered
) -> None:
    """The worker calls' units take pooled connections that are not pinged per call: when the
    database drops them, the call that meets a dead one answers 503 + Retry-After (the worker
    backs off and retries), and the next runs on a fresh connection."""
    make_run(db, n_rows=8)
    _, token = make_worker(db)
    db.commit()
    db.close()
    lease = acquire_lease(lease_client, token)
    assert _call(lease_client, token, lease, "heartbeat").status_code == 200
    assert terminate_other_backends(lease_path.database_url) >= 1
    failed = _call(lease_client, token, lease, "heartbeat")
    assert failed.status_code == 503 and failed.headers["Retry-After"] == "1", failed.text
    assert failed.json()["code"] == "database_unavailable"
    assert _call(lease_client, token, lease, "heartbeat").json()["abort"] is False
    answered.expect({"acquire": 1, "heartbeat": 3})
