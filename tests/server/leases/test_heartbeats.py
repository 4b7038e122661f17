"""POST /api/v1/leases/heartbeat: several held leases' heartbeats in one call, each answered on
its own as its single heartbeat would answer (docs/architecture/protocol.md, "Worker calls").
On both databases; the Postgres and SQLite servers compared whole at the end."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from server.models import Lease, PromptRow, Run
from tests.server.leases.helpers import acquire_lease, bearer, make_run, make_worker
from tests.server.leases.lease_paths import POSTGRES, SQLITE, Answered
from tests.server.leases.twins import BASE, Sent, Servers, Side, empty, send

BEATS = f"{BASE}/heartbeat"


def _beat(lease: dict[str, Any], fencing_shift: int = 0) -> dict[str, Any]:
    return {"lease_id": lease["lease_id"], "fencing": lease["fencing"] + fencing_shift}


def _expiry(db: Session, lease: dict[str, Any]) -> Any:
    db.expire_all()
    value = db.execute(
        select(Lease.expires_at).where(Lease.id == uuid.UUID(lease["lease_id"]))
    ).scalar_one()
    db.commit()
    return value


def test_each_lease_is_answered_on_its_own(
    lease_client: TestClient, db: Session, answered: Answered
) -> None:
    first = make_run(db, n_rows=6)
    _, token = make_worker(db, name="mine")
    _, other_token = make_worker(db, name="other")
    db.commit()
    fine, lost = acquire_lease(lease_client, token), acquire_lease(lease_client, token)
    others = acquire_lease(lease_client, other_token)
    second = make_run(db, n_rows=2)
    db.commit()
    paused = acquire_lease(lease_client, token)
    assert paused["run_id"] == str(second.id) and fine["run_id"] == str(first.id)
    db.execute(update(Run).where(Run.id == second.id).values(status="paused"))
    db.commit()
    before = _expiry(db, fine)
    unknown = {"lease_id": str(uuid.uuid4()), "fencing": 1}

    body = [_beat(paused), unknown, _beat(others), _beat(lost, 1), _beat(fine)]
    answer = lease_client.post(BEATS, json={"leases": body}, headers=bearer(token))

    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert [r["lease_id"] for r in results] == [b["lease_id"] for b in body]  # request order
    assert [r["status"] for r in results] == [200, 404, 404, 409, 200]
    assert results[0]["heartbeat"] == {
        "current_version": 0, "abort": True, "ttl_s": 0.0, "reason": "run_paused"
    }  # fmt: skip
    assert results[4]["heartbeat"]["abort"] is False and results[4]["detail"] is None
    assert results[1]["detail"] == results[2]["detail"] == "lease not found"
    assert "lease lost" in results[3]["detail"] and results[3]["heartbeat"] is None
    assert _expiry(db, fine) > before
    states = dict(
        db.execute(
            select(Lease.id, Lease.state).where(
                Lease.id.in_([uuid.UUID(x["lease_id"]) for x in (fine, lost, others, paused)])
            )
        ).all()
    )
    assert [states[uuid.UUID(x["lease_id"])] for x in (fine, lost, others, paused)] == [
        "active", "active", "active", "aborted"
    ]  # fmt: skip
    requeued = db.execute(select(PromptRow.state).where(PromptRow.run_id == second.id)).scalars()
    assert set(requeued) == {"queued"}
    db.commit()
    answered.expect({"acquire": 4, "heartbeat": 1 + 4})


def test_bad_lists_are_refused_whole(
    lease_client: TestClient, db: Session, answered: Answered
) -> None:
    make_run(db, n_rows=2)
    _, token = make_worker(db)
    db.commit()
    lease = acquire_lease(lease_client, token)
    one = _beat(lease)
    for leases, field in [
        ([], "leases"),
        ([one, dict(one)], "leases"),
        ([{"lease_id": str(uuid.uuid4()), "fencing": 0}] * 513, "leases"),
        ([{**one, "extra": 1}], "leases.0.extra"),
        ([{"lease_id": "nope", "fencing": 0}], "leases.0.lease_id"),
        ([{"lease_id": one["lease_id"], "fencing": -1}], "leases.0.fencing"),
    ]:
        answer = lease_client.post(BEATS, json={"leases": leases}, headers=bearer(token))
        assert answer.status_code == 422, (field, answer.text)
        assert answer.json()["errors"][0]["field"] == field, answer.text
    assert lease_client.post(BEATS, json={"leases": [one]}).status_code == 401
    forged = lease_client.post(BEATS, json={"leases": [one]}, headers=bearer("agr_wkr_x"))
    assert forged.status_code == 401
    # The forged token is refused by the call (one lease, counted); the missing token and the
    # bad lists before it (not counted).
    answered.expect({"acquire": 1, "heartbeat": 1})


def test_postgres_and_sqlite_answer_a_batch_alike(servers: Servers) -> None:
    """The same mixed batch on both databases (the heartbeat's statement is written once for
    each: server/leases/statements.py): the same whole answer and the same rows."""
    namespace = uuid.uuid4()

    def arrange(side: Side) -> Sent:
        empty(side.app)
        side.run(n_rows=8)
        token, other = side.worker(), side.worker("other")
        fine, lost, stale = (side.acquire(token) for _ in range(3))
        others = side.acquire(other)
        side.execute(update(Lease).where(Lease.id == uuid.UUID(stale["lease_id"])).values(
            adapter_version=-5))  # fmt: skip
        leases = [_beat(stale), _beat(others), _beat(lost, 7), _beat(fine)]
        return Sent(BEATS, {"leases": leases}, bearer(token))

    outcome = {
        database: send(Side(app, client, namespace), arrange(Side(app, client, namespace)))
        for database, (app, client) in servers.items()
    }
    postgres, sqlite = outcome[POSTGRES], outcome[SQLITE]
    for answered in (postgres, sqlite):
        assert answered.status == 200, answered.body
        assert [r["status"] for r in answered.raw["results"]] == [200, 404, 409, 200]
        assert answered.raw["results"][0]["heartbeat"]["reason"] == "stale"
        assert answered.raw["results"][3]["heartbeat"]["abort"] is False
        assert answered.calls == {"heartbeat": 4}  # each lease of the batch
    assert (sqlite.status, sqlite.body) == (postgres.status, postgres.body)
    assert sqlite.rows == postgres.rows
