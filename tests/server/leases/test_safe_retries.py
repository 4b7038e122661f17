"""Safe retries of the worker calls (docs/architecture/protocol.md, "Safe retries"), on both
databases: an acquire, a complete and a release whose answers are lost after the server
committed are retried by the typed client under the same Idempotency-Key and get the first
answer: no second lease, no 409, every row the engine touches as the first call left it."""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from protocol.client import AsyncGrpoClient, ConflictError
from protocol.idempotency import IDEMPOTENCY_HEADER, new_key
from protocol.schemas import BatchManifest, Lease
from server.db_types import db_now_plus
from server.jobs.runner import JobContext, run_job
from server.learner.ledger import ledger_model
from server.models import IdempotentAnswer, Worker
from server.models import Lease as LeaseRow
from tests.harness.lossy import LossyLink, Sent
from tests.server.leases.helpers import bearer, make_run, make_worker, snapshot


class World:
    """A running run, a worker's typed client over a lossy link, and what the database held
    when an answer was lost."""

    def __init__(self, app: FastAPI, http: TestClient, db: Session, lose: dict[str, int]) -> None:
        run = make_run(db, n_rows=4)
        self.run_id = run.id
        _, self.token = make_worker(db)
        db.commit()
        self.app, self.http, self.db = app, http, db
        self.at_loss: list[dict[str, Any]] = []
        self.link = LossyLink(http, lose, on_loss=self._record)
        self.client = AsyncGrpoClient(
            "http://testserver",
            self.token,
            http=self.link,
            sleep=lambda _s: None,  # type: ignore[arg-type]
        )

    def _record(self, _sent: Sent) -> None:
        self.at_loss.append(self.state())

    def state(self) -> dict[str, Any]:
        ledger = ledger_model(self.db, self.run_id).model_dump()
        return {"rows": snapshot(self.db, self.run_id), "ledger": ledger}

    def manifest(self, lease: Lease) -> BatchManifest:
        data = json.dumps({"lease": str(lease.lease_id)}).encode()
        self.app.state.store.put_bytes(lease.batch_key, data)
        return BatchManifest(
            key=lease.batch_key, sha256=hashlib.sha256(data).hexdigest(), size=len(data),
            n_samples=len(lease.prompts) * lease.group_size, n_tokens=10, generation_seconds=0.1,
        )  # fmt: skip

    def leases(self) -> int:
        query = select(func.count()).select_from(LeaseRow).where(LeaseRow.run_id == self.run_id)
        count = int(self.db.execute(query).scalar_one())
        self.db.commit()
        return count


def _retried_once(sent: list[Sent]) -> tuple[Sent, Sent]:
    """The lost answer and its retry's: the same key, the same status and body."""
    assert len(sent) == 2, sent
    lost, retried = sent
    assert lost.lost and not retried.lost
    assert lost.key is not None and lost.key == retried.key
    assert (retried.status_code, retried.body) == (lost.status_code, lost.body)
    return lost, retried


def test_a_lost_acquire_answer_is_retried_into_the_same_lease(
    lease_app: FastAPI, lease_client: TestClient, db: Session
) -> None:
    world = World(lease_app, lease_client, db, {"/acquire": 1})
    lease = world.client.acquire_lease()
    assert lease is not None
    lost, _ = _retried_once(world.link.to("/acquire"))
    assert lost.status_code == 200 and json.loads(lost.body)["lease_id"] == str(lease.lease_id)
    assert world.leases() == 1  # no second grant
    assert world.state() == world.at_loss[0]  # the retry changed nothing
    assert world.client.release_lease(lease).released == len(lease.prompts)  # it is the lease


def test_a_lost_complete_answer_is_retried_into_the_same_batch_not_a_409(
    lease_app: FastAPI, lease_client: TestClient, db: Session
) -> None:
    world = World(lease_app, lease_client, db, {"/complete": 1})
    lease = world.client.acquire_lease()
    assert lease is not None
    done = world.client.complete_lease(lease, world.manifest(lease))
    assert done.state == "accepted"
    lost, _ = _retried_once(world.link.to("/complete"))
    assert json.loads(lost.body)["batch_id"] == str(done.batch_id)
    assert world.state() == world.at_loss[0]
    assert {s for *_, s in world.state()["rows"]["batches"]} == {"accepted"}


def test_a_lost_release_answer_is_retried_into_the_same_release_not_a_409(
    lease_app: FastAPI, lease_client: TestClient, db: Session
) -> None:
    world = World(lease_app, lease_client, db, {"/release": 1})
    lease = world.client.acquire_lease()
    assert lease is not None
    assert world.client.release_lease(lease, reason="engine_fault").released == len(lease.prompts)
    _retried_once(world.link.to("/release"))
    after = world.state()
    assert after == world.at_loss[0]
    attempts = [row.attempts for row in after["rows"]["rows"] if row.id in _rows_of(lease)]
    assert attempts == [1] * len(lease.prompts)  # one attempt counted, not two


def test_without_a_key_the_retry_of_a_lost_complete_answers_409(
    lease_app: FastAPI, lease_client: TestClient, db: Session
) -> None:
    """What the key prevents: a call without one behaves as before, its retry refused."""
    world = World(lease_app, lease_client, db, {"/complete": 1})
    lease = world.client.acquire_lease()
    assert lease is not None
    body = {"fencing": lease.fencing, "manifest": world.manifest(lease).model_dump(mode="json")}
    with pytest.raises(ConflictError) as refused:
        world.client.request("POST", f"/api/v1/leases/{lease.lease_id}/complete", json=body)
    assert refused.value.lease_lost
    assert [s.key for s in world.link.to("/complete")] == [None, None]


def _rows_of(lease: Lease) -> set[int]:
    return {p.prompt_row_id for p in lease.prompts}


def _acquire(http: TestClient, token: str, key: str, body: dict[str, Any] | None = None) -> Any:
    headers = {**bearer(token), IDEMPOTENCY_HEADER: key}
    return http.post("/api/v1/leases/acquire", json=body or {}, headers=headers)


def test_a_key_is_the_callers_and_its_request_s(
    lease_app: FastAPI, lease_client: TestClient, db: Session
) -> None:
    """Another body under the same key: 422 idempotency_key_reused, nothing granted; another
    worker's same key is its own call; a key that is not a UUIDv7: 422."""
    world = World(lease_app, lease_client, db, {})
    _, other = make_worker(db, name="other")
    db.commit()
    key = new_key()
    first = _acquire(lease_client, world.token, key)
    assert first.status_code == 200
    reused = _acquire(lease_client, world.token, key, {"models": ["tiny-model"]})
    assert (reused.status_code, reused.json()["code"]) == (422, "idempotency_key_reused")
    theirs = _acquire(lease_client, other, key)
    assert theirs.status_code == 200 and theirs.json()["lease_id"] != first.json()["lease_id"]
    assert world.leases() == 2
    for bad in ("not-a-key", str(uuid.uuid4())):
        refused = _acquire(lease_client, world.token, bad)
        assert (refused.status_code, refused.json()["code"]) == (422, "idempotency_key_invalid")
    assert world.leases() == 2


@pytest.mark.parametrize(
    ("path", "body"),
    [("acquire", {}), ("00000000-0000-7000-8000-000000000001/release", {"fencing": 1})],
    ids=["acquire", "release"],
)
def test_an_unknown_token_is_a_401_before_its_key_is_judged(
    lease_client: TestClient, path: str, body: dict[str, Any]
) -> None:
    """A token the server does not know is refused 401 whatever the Idempotency-Key holds
    (server/leases/keyed.py lease_key: complete, acquire and release share it)."""
    for key in ("not-a-key", new_key()):
        refused = lease_client.post(
            f"/api/v1/leases/{path}",
            json=body,
            headers={"Authorization": "Bearer agr_wrk_garbage", IDEMPOTENCY_HEADER: key},
        )
        assert refused.status_code == 401, (key, refused.text)


def test_a_204_is_not_kept_its_retry_may_grant(
    lease_app: FastAPI, lease_client: TestClient, db: Session
) -> None:
    """An acquire that granted nothing applied nothing: its key is let go, and a retry under
    it that finds work is granted (once)."""
    world = World(lease_app, lease_client, db, {})
    key = new_key()
    _, idle = make_worker(db, name="idle", models=["another-model"])
    db.commit()
    assert _acquire(lease_client, idle, key).status_code == 204
    assert db.execute(select(func.count()).select_from(IdempotentAnswer)).scalar_one() == 0
    db.commit()
    granted = _acquire(lease_client, world.token, key)
    again = _acquire(lease_client, world.token, key)
    assert granted.status_code == again.status_code == 200
    assert granted.json() == again.json() and world.leases() == 1


def test_a_key_past_its_retention_is_refused_never_applied_again(
    lease_app: FastAPI, lease_client: TestClient, db: Session
) -> None:
    """Once the idempotency job let a key's answer go (older than idempotency_retention_s),
    that key and any older one of its caller are refused (422 idempotency_key_expired) and grant
    nothing; a key made after it still works, and other callers' keys are untouched."""
    world = World(lease_app, lease_client, db, {})
    _, other = make_worker(db, name="other")
    db.commit()
    made = 1_800_000_000.0
    old_key, older_key, new = new_key(made), new_key(made - 5), new_key(made + 1)
    theirs = new_key(made - 10)
    assert _acquire(lease_client, world.token, old_key).status_code == 200
    their_lease = _acquire(lease_client, other, theirs).json()
    retention = lease_app.state.settings.idempotency_retention_s
    db.execute(
        update(IdempotentAnswer)
        .where(IdempotentAnswer.key == uuid.UUID(old_key))
        .values(created_at=db_now_plus(-retention - 1))
    )
    db.commit()
    context = JobContext(lease_app.state.settings, lease_app.state.sessionmaker, lambda: None)
    assert run_job("idempotency", context) == 1  # the other caller's answer is kept
    assert world.leases() == 2
    for forgotten in (old_key, older_key):
        refused = _acquire(lease_client, world.token, forgotten)
        assert refused.status_code == 422, refused.text
        assert refused.json()["code"] == "idempotency_key_expired"
    assert world.leases() == 2
    assert _acquire(lease_client, other, theirs).json() == their_lease  # its stored answer
    assert world.leases() == 2
    released = lease_client.post(
        f"/api/v1/leases/{their_lease['lease_id']}/release",
        json={"fencing": their_lease["fencing"]},
        headers=bearer(other),
    )
    assert released.status_code == 200  # room for one more grant
    assert _acquire(lease_client, world.token, new).status_code == 200
    assert world.leases() == 3


def test_a_revoked_workers_repeat_is_refused_not_answered(
    lease_app: FastAPI, lease_client: TestClient, db: Session
) -> None:
    world = World(lease_app, lease_client, db, {})
    key = new_key()
    assert _acquire(lease_client, world.token, key).status_code == 200
    db.execute(update(Worker).values(status="revoked"))
    db.commit()
    refused = _acquire(lease_client, world.token, key)
    assert (refused.status_code, refused.json()["code"]) == (401, "worker_revoked")
