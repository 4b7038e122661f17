"""POST /api/v1/leases/acquire: what a lease carries, who gets one, fairness, admission."""

from __future__ import annotations

import time
import uuid

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from protocol import layout
from server.db_types import db_now
from server.leases.service import lease_seed
from server.models import AdapterVersion, Lease, PromptRow, Run
from server.tokens import service as tokens
from tests.server.leases.helpers import MODEL, in_flight, make_run, make_worker
from tests.server.leases.lease_paths import Answered

ACQUIRE = "/api/v1/leases/acquire"


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_lease_carries_front_rows_and_never_reference_columns(
    lease_client: TestClient, db: Session, answered: Answered
) -> None:
    run = make_run(db, n_rows=5, seed=7)
    worker, token = make_worker(db)
    db.commit()
    response = lease_client.post(ACQUIRE, json={}, headers=_h(token))
    assert response.status_code == 200, response.text
    lease = response.json()
    assert "answer" not in response.text and "reference" not in response.text
    front = db.execute(
        select(PromptRow.id, PromptRow.dataset_row_id)
        .where(PromptRow.run_id == run.id)
        .order_by(PromptRow.queue_pos)
        .limit(2)
    ).all()
    assert [(p["prompt_row_id"], p["dataset_row_id"]) for p in lease["prompts"]] == [
        tuple(r) for r in front
    ]
    assert [p["prompt"] for p in lease["prompts"]] == ["What is 0 + 1?", "What is 1 + 1?"]
    assert lease["run_id"] == str(run.id) and lease["base_model"] == run.base_model
    assert lease["group_size"] == 2 and lease["adapter_version"] == 0 and lease["adapter"] is None
    assert lease["ttl_s"] == 60.0 and lease["heartbeat_interval_s"] == 5.0
    assert lease["max_new_tokens"] == run.config["sampling"]["max_new_tokens"]
    assert lease["batch_key"] == layout.batch_key(run.id, lease["lease_id"], lease["fencing"])
    db.expire_all()
    row = db.get(Lease, uuid.UUID(lease["lease_id"]))
    assert row is not None and row.state == "active" and row.worker_id == worker.id
    assert row.fencing == lease["fencing"] and row.seed == lease["seed"]
    # Postgres computes the seed inside the one-statement grant; it is the same function.
    assert lease["seed"] == lease_seed(7, run.id, lease["fencing"])
    # expires_at comes from the database clock: now + ttl.
    remaining = (row.expires_at - db.execute(select(db_now())).scalar_one()).total_seconds()
    assert 55 < remaining <= 60
    db.refresh(run)
    assert run.groups_in_flight == in_flight(db, run.id) == 2
    assert run.last_lease_at is not None
    db.refresh(worker)
    assert worker.last_seen_at is not None
    answered.expect({"acquire": 1})


def test_lease_of_a_published_version_has_a_download_url(
    lease_client: TestClient, db: Session
) -> None:
    run = make_run(db, n_rows=4)
    _, token = make_worker(db)
    key = layout.adapter_key(run.id, 1, "adapter_model.safetensors")
    db.add(
        AdapterVersion(
            run_id=run.id,
            version=1,
            files={"adapter_model.safetensors": {"key": key, "sha256": "a" * 64, "bytes": 3}},
            sha256="b" * 64,
            bytes=3,
            learner_step=1,
        )
    )
    db.execute(update(Run).where(Run.id == run.id).values(current_version=1))
    db.commit()
    lease = lease_client.post(ACQUIRE, json={}, headers=_h(token)).json()
    assert lease["adapter_version"] == 1
    (file,) = lease["adapter"]["files"]
    assert file["name"] == "adapter_model.safetensors" and file["sha256"] == "a" * 64
    assert key in file["url"] and lease["adapter"]["sha256"] == "b" * 64


@pytest.mark.parametrize("status", ["pending", "paused", "cancelled", "completed", "failed"])
def test_runs_that_are_not_running_hand_out_nothing(
    lease_client: TestClient, db: Session, status: str
) -> None:
    make_run(db, status=status)
    _, token = make_worker(db)
    db.commit()
    assert lease_client.post(ACQUIRE, json={}, headers=_h(token)).status_code == 204


def test_quarantined_worker_and_unserved_models_get_nothing(
    lease_client: TestClient, db: Session, answered: Answered
) -> None:
    make_run(db)
    _, quarantined = make_worker(db, status="quarantined")
    _, other_model = make_worker(db, models=["some-other-model"])
    _, serving = make_worker(db)
    db.commit()
    assert lease_client.post(ACQUIRE, json={}, headers=_h(quarantined)).status_code == 204
    assert lease_client.post(ACQUIRE, json={}, headers=_h(other_model)).status_code == 204
    narrowed = lease_client.post(ACQUIRE, json={"models": []}, headers=_h(serving))
    assert narrowed.status_code == 204
    assert lease_client.post(ACQUIRE, json={}, headers=_h(serving)).status_code == 200
    # Only the quarantined worker is not the common case.
    answered.expect({"acquire": 3 + 1})


def test_a_model_the_worker_did_not_register_is_refused(
    lease_client: TestClient, db: Session, answered: Answered
) -> None:
    """A worker restarted with another --model reuses its token file: it would wait forever
    for leases of a model it is not registered for, so acquire says so (409)."""
    make_run(db)
    _, serving = make_worker(db)
    db.commit()
    assert (
        lease_client.post(ACQUIRE, json={"models": [MODEL]}, headers=_h(serving)).status_code == 200
    )
    refused = lease_client.post(
        ACQUIRE, json={"models": ["Qwen/Qwen2.5-1.5B-Instruct"]}, headers=_h(serving)
    )
    assert refused.status_code == 409
    detail = refused.json()["detail"]
    assert "asks for leases of 'Qwen/Qwen2.5-1.5B-Instruct' (--model)" in detail
    assert f"registered with [{MODEL!r}]" in detail
    answered.expect({"acquire": 1 + 1})


def test_other_tokens_are_refused_and_unknown_fields_are_422(
    lease_client: TestClient, db: Session, answered: Answered
) -> None:
    run = make_run(db)
    _, token = make_worker(db)
    learner = tokens.mint(db, "learner", scope_id=run.id).plaintext
    admin = tokens.mint(db, "admin").plaintext
    db.commit()
    assert lease_client.post(ACQUIRE, json={}, headers=_h(learner)).status_code == 403
    assert lease_client.post(ACQUIRE, json={}, headers=_h(admin)).status_code == 403
    assert lease_client.post(ACQUIRE, json={}).status_code == 401
    bad = lease_client.post(ACQUIRE, json={"surprise": 1}, headers=_h(token))
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "surprise"
    lease = lease_client.post(ACQUIRE, json={}, headers=_h(token)).json()
    path = f"/api/v1/leases/{lease['lease_id']}/heartbeat"
    assert lease_client.post(path, json={"fencing": 1}, headers=_h(learner)).status_code == 403
    extra = lease_client.post(path, json={"fencing": 1, "x": 2}, headers=_h(token))
    assert extra.status_code == 422
    # Another kind of token is refused by the call (counted); no token at all, and a body with
    # unknown fields, before it (not counted).
    answered.expect({"acquire": 2 + 1, "heartbeat": 1})


def test_priority_first_then_round_robin(lease_client: TestClient, db: Session) -> None:
    low_a = make_run(db, n_rows=20)
    low_b = make_run(db, n_rows=20)
    high = make_run(db, n_rows=2, priority=5)
    _, token = make_worker(db)
    db.commit()
    runs = [
        lease_client.post(ACQUIRE, json={}, headers=_h(token)).json()["run_id"] for _ in range(5)
    ]
    assert runs[0] == str(high.id)  # priority first, until its queue is empty
    rest = runs[1:]
    assert set(rest) == {str(low_a.id), str(low_b.id)}
    assert all(a != b for a, b in zip(rest, rest[1:], strict=False))  # alternating


def test_admission_bound_answers_204(
    lease_client: TestClient, db: Session, answered: Answered
) -> None:
    run = make_run(db, n_rows=20)  # bound (1 + 1) × 1 × 4 = 8 groups, 2 per lease
    _, token = make_worker(db)
    db.commit()
    codes = [lease_client.post(ACQUIRE, json={}, headers=_h(token)).status_code for _ in range(6)]
    assert codes == [200, 200, 200, 200, 204, 204]
    db.refresh(run)
    assert run.groups_in_flight == in_flight(db, run.id) == 8
    answered.expect({"acquire": 6})  # the bound's 204 is the common case too


def test_partial_last_lease_then_nothing(lease_client: TestClient, db: Session) -> None:
    make_run(db, n_rows=3, prompts_per_lease=2, prompts_per_step=2, max_staleness=10)
    _, token = make_worker(db)
    db.commit()
    first = lease_client.post(ACQUIRE, json={}, headers=_h(token)).json()
    last = lease_client.post(ACQUIRE, json={}, headers=_h(token)).json()
    assert len(first["prompts"]) == 2 and len(last["prompts"]) == 1
    assert last["fencing"] > first["fencing"]
    assert lease_client.post(ACQUIRE, json={}, headers=_h(token)).status_code == 204


def test_long_poll_waits_then_answers_204(lease_app, db: Session) -> None:  # type: ignore[no-untyped-def]
    lease_app.state.settings.lease_long_poll_s = 0.6
    _, token = make_worker(db)
    db.commit()
    with TestClient(lease_app) as client:
        start = time.monotonic()
        response = client.post(ACQUIRE, json={"wait_s": 5}, headers=_h(token))
        elapsed = time.monotonic() - start
    assert response.status_code == 204
    assert 0.55 <= elapsed < 3.0  # capped by the server's lease_long_poll_s


def test_a_version_without_its_adapter_row_grants_nothing(
    lease_client: TestClient, db: Session
) -> None:
    """A run at a version whose adapter row is missing (a broken database) has nothing a lease
    could carry: 204 and nothing changed, on both databases (it was a 500, and the event-loop
    grant of the engine before issue 27 had already committed its lease)."""
    run = make_run(db, n_rows=4)
    _worker, token = make_worker(db)
    db.execute(update(Run).where(Run.id == run.id).values(current_version=1))
    db.commit()
    assert lease_client.post(ACQUIRE, json={}, headers=_h(token)).status_code == 204
    db.expire_all()
    assert db.execute(select(Lease.id)).first() is None
    assert in_flight(db, run.id) == 0
    assert db.execute(select(Run.groups_in_flight).where(Run.id == run.id)).scalar_one() == 0
    states = db.execute(select(PromptRow.state).where(PromptRow.run_id == run.id)).scalars()
    assert set(states) == {"queued"}
