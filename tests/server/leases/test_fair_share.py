"""Fair share of a run's admission bound (docs/architecture/lease-engine.md, "Fair share", invariant
25; server/leases/fair_share.py): while several workers wait on one run, none holds more than
max(ceil(bound / contenders), one lease); a lone worker still fills the whole bound."""

from __future__ import annotations

import uuid

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from server.db_types import db_now_plus
from server.leases import fair_share
from server.models import Lease, Run, Worker
from tests.server.leases.helpers import bearer, in_flight, make_run, make_worker, work_one_lease

ACQUIRE = "/api/v1/leases/acquire"
# prompts_per_lease 2, (max_staleness 1 + 1) × weight_sync_steps 1 × prompts_per_step 4: B = 8.
BOUND = 8


def _acquire_all(client: TestClient, token: str) -> int:
    """Acquire until 204; how many leases were granted."""
    granted = 0
    while client.post(ACQUIRE, json={}, headers=bearer(token)).status_code == 200:
        granted += 1
        assert granted <= 100
    return granted


def _held(db: Session, run_id: uuid.UUID, worker_id: uuid.UUID) -> int:
    db.expire_all()
    held = db.execute(
        select(func.coalesce(func.sum(Lease.n_prompts), 0)).where(
            Lease.run_id == run_id, Lease.worker_id == worker_id, Lease.state == "active"
        )
    ).scalar_one()
    db.commit()
    return int(held)


def _waiting_since(db: Session, worker_id: uuid.UUID) -> object:
    db.expire_all()
    worker = db.get(Worker, worker_id)
    assert worker is not None
    value = worker.waiting_since
    db.commit()
    return value


def test_a_lone_worker_fills_the_whole_bound(lease_client: TestClient, db: Session) -> None:
    run = make_run(db, n_rows=20)
    worker, token = make_worker(db)
    db.commit()
    assert _acquire_all(lease_client, token) == BOUND // 2
    assert _held(db, run.id, worker.id) == in_flight(db, run.id) == BOUND


def test_two_waiting_workers_share_the_bound(lease_client: TestClient, db: Session) -> None:
    run = make_run(db, n_rows=20, status="paused")
    first, first_token = make_worker(db, name="first")
    second, second_token = make_worker(db, name="second")
    db.commit()
    # The second asks while nothing is admissible: it is waiting.
    assert lease_client.post(ACQUIRE, json={}, headers=bearer(second_token)).status_code == 204
    assert _waiting_since(db, second.id) is not None
    db.execute(update(Run).where(Run.id == run.id).values(status="running"))
    db.commit()
    assert _acquire_all(lease_client, first_token) == 2  # ceil(8 / 2) = 4 rows
    assert _held(db, run.id, first.id) == BOUND // 2
    assert _waiting_since(db, first.id) is not None  # its last try granted nothing
    assert _acquire_all(lease_client, second_token) == 2
    assert _held(db, run.id, second.id) == BOUND // 2
    assert in_flight(db, run.id) == BOUND


def test_rows_waiting_for_the_learner_count_toward_the_share(
    lease_client: TestClient, db: Session
) -> None:
    # A fast worker whose batches wait for the learner holds no active lease, but its accepted
    # rows are in flight: it may not take the slots the learner frees from a waiting worker.
    run = make_run(db, n_rows=20, status="paused")
    first, first_token = make_worker(db, name="first")
    second, second_token = make_worker(db, name="second")
    db.commit()
    assert lease_client.post(ACQUIRE, json={}, headers=bearer(second_token)).status_code == 204
    db.execute(update(Run).where(Run.id == run.id).values(status="running"))
    db.commit()
    for _ in range(2):
        assert work_one_lease(lease_client, bearer(first_token)) is not None
    assert _held(db, run.id, first.id) == 0 and in_flight(db, run.id) == BOUND // 2
    db.commit()  # no read transaction left open (SQLite's writer would wait for it)
    assert lease_client.post(ACQUIRE, json={}, headers=bearer(first_token)).status_code == 204
    assert _acquire_all(lease_client, second_token) == 2
    assert _held(db, run.id, second.id) == BOUND // 2
    assert in_flight(db, run.id) == BOUND


def test_a_lease_holder_is_a_contender_and_a_grant_clears_waiting(
    lease_client: TestClient, db: Session
) -> None:
    run = make_run(db, n_rows=20)
    first, first_token = make_worker(db, name="first")
    second, second_token = make_worker(db, name="second")
    db.commit()
    assert lease_client.post(ACQUIRE, json={}, headers=bearer(second_token)).status_code == 200
    assert _waiting_since(db, second.id) is None
    assert _acquire_all(lease_client, first_token) == 2
    assert _held(db, run.id, first.id) == BOUND // 2
    assert _acquire_all(lease_client, second_token) == 1
    assert _held(db, run.id, second.id) == BOUND // 2


def test_a_worker_unseen_for_long_no_longer_contends(lease_client: TestClient, db: Session) -> None:
    run = make_run(db, n_rows=20, status="paused")
    first, first_token = make_worker(db, name="first")
    _, second_token = make_worker(db, name="second")
    db.commit()
    assert lease_client.post(ACQUIRE, json={}, headers=bearer(second_token)).status_code == 204
    gone = db_now_plus(-2 * fair_share.MIN_WAITING_WINDOW_S)
    db.execute(update(Worker).where(Worker.name == "second").values(last_seen_at=gone))
    db.execute(update(Run).where(Run.id == run.id).values(status="running"))
    db.commit()
    assert _acquire_all(lease_client, first_token) == BOUND // 2
    assert _held(db, run.id, first.id) == BOUND


def test_no_fair_share_without_admission_control(lease_client: TestClient, db: Session) -> None:
    run = make_run(db, n_rows=6, epochs=1, status="paused", admission_control=False)
    first, first_token = make_worker(db, name="first")
    _, second_token = make_worker(db, name="second")
    db.commit()
    assert lease_client.post(ACQUIRE, json={}, headers=bearer(second_token)).status_code == 204
    db.execute(update(Run).where(Run.id == run.id).values(status="running"))
    db.commit()
    assert _acquire_all(lease_client, first_token) == 3
    assert _held(db, run.id, first.id) == 6


@pytest.mark.parametrize(
    ("bound", "n", "contenders", "cap"),
    [(8, 2, 1, 8), (8, 2, 2, 4), (8, 2, 3, 3), (8, 2, 8, 2), (9, 2, 2, 5), (8, 4, 4, 4)],
)
def test_the_cap_is_the_share_but_never_under_one_lease(
    bound: int, n: int, contenders: int, cap: int
) -> None:
    assert fair_share.worker_cap(bound, n, contenders) == cap


def test_the_share_is_read_only_where_it_can_matter() -> None:
    assert not fair_share.needed(8, 0, 2)  # below half the bound
    assert not fair_share.needed(8, 2, 2)  # exactly half
    assert fair_share.needed(8, 4, 2) and fair_share.needed(8, 6, 2)
    assert not fair_share.needed(8, 8, 2)  # the bound refuses anyway
    assert not fair_share.needed(fair_share.NO_CAP, 2**30, 2)  # admission control off
