"""queue.requeue / consume / admit and expiry.sweep_expired on both databases."""

from __future__ import annotations

import uuid

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from server.db_types import db_now_plus
from server.leases import expiry, queue
from server.models import Lease, PromptRow, Run
from tests.server.leases.helpers import in_flight, make_run, make_worker


def _rows(session: Session, run_id: uuid.UUID) -> list[PromptRow]:
    session.expire_all()
    return list(
        session.execute(
            select(PromptRow).where(PromptRow.run_id == run_id).order_by(PromptRow.queue_pos)
        ).scalars()
    )


def _lease_rows(
    session: Session, run: Run, n: int, *, ttl: float = 60.0
) -> tuple[uuid.UUID, list[int]]:
    """Lease the first n queued rows by hand (what acquire does), counting them in flight."""
    worker, _ = make_worker(session, name=f"w{uuid.uuid4().hex[:4]}")
    queued = [r for r in _rows(session, run.id) if r.state == "queued"][:n]
    fencing = queue.admit(session, run.id, len(queued), 1000)
    assert fencing is not None
    lease_id = uuid.uuid4()
    session.add(
        Lease(
            id=lease_id,
            run_id=run.id,
            worker_id=worker.id,
            adapter_version=0,
            fencing=fencing[0],
            expires_at=db_now_plus(ttl),
            seed=1,
            n_prompts=len(queued),
            group_size=2,
        )
    )
    for r in queued:
        r.state, r.lease_id = "leased", lease_id
    session.flush()
    return lease_id, [r.id for r in queued]


def test_requeue_goes_to_the_front_in_order_and_counts_attempts(any_session: Session) -> None:
    run = make_run(any_session, n_rows=6)
    _, first = _lease_rows(any_session, run, 2)
    _, second = _lease_rows(any_session, run, 2)
    assert in_flight(any_session, run.id) == 4
    result = queue.requeue(any_session, run.id, first, "expired", count_attempt=True)
    assert result.requeued == first and result.dropped == []
    rows = _rows(any_session, run.id)
    queued = [r for r in rows if r.state == "queued"]
    # The re-queued rows are now at the front, in their original order, ahead of untouched rows.
    assert [r.id for r in queued[:2]] == first
    assert all(r.attempts == 1 and r.lease_id is None for r in queued[:2])
    assert all(r.last_requeue_reason == "expired" for r in queued[:2])
    any_session.refresh(run)
    assert run.groups_in_flight == in_flight(any_session, run.id) == 2
    # A voluntary release counts no attempt and goes ahead of the earlier re-queue.
    queue.requeue(any_session, run.id, second, "release", count_attempt=False)
    queued = [r for r in _rows(any_session, run.id) if r.state == "queued"]
    assert [r.id for r in queued[:4]] == second + first
    assert [r.attempts for r in queued[:4]] == [0, 0, 1, 1]
    any_session.refresh(run)
    assert run.groups_in_flight == 0


def test_requeue_drops_after_max_attempts(any_session: Session) -> None:
    run = make_run(any_session, n_rows=2, max_attempts=2)
    for attempt in range(2):
        _, ids = _lease_rows(any_session, run, 2)
        result = queue.requeue(any_session, run.id, ids, "stale", count_attempt=True)
        if attempt == 0:
            assert result.requeued == ids
    assert result.dropped == ids and result.requeued == []
    rows = _rows(any_session, run.id)
    assert {(r.state, r.drop_reason, r.attempts) for r in rows} == {
        ("dropped", "stale_exhausted", 2)
    }
    any_session.refresh(run)
    assert run.groups_in_flight == 0


def test_requeue_ignores_rows_not_in_flight(any_session: Session) -> None:
    run = make_run(any_session, n_rows=3)
    ids = [r.id for r in _rows(any_session, run.id)]
    result = queue.requeue(any_session, run.id, ids, "expired", count_attempt=True)
    assert result.requeued == [] and result.dropped == []
    any_session.refresh(run)
    assert run.groups_in_flight == 0 and run.queue_head == 0


def test_consume_marks_rows_and_decrements(any_session: Session) -> None:
    run = make_run(any_session, n_rows=4)
    _, ids = _lease_rows(any_session, run, 2)
    batch = uuid.uuid4()
    any_session.execute(
        update(PromptRow).where(PromptRow.id.in_(ids)).values(state="claimed", batch_id=batch)
    )
    assert queue.consume(any_session, run.id, [batch], 3) == 2
    rows = [r for r in _rows(any_session, run.id) if r.id in ids]
    assert {(r.state, r.consumed_version) for r in rows} == {("consumed", 3)}
    any_session.refresh(run)
    assert run.groups_in_flight == 0
    assert queue.consume(any_session, run.id, [batch], 4) == 0  # never twice


def test_admit_is_a_bound_and_fencing_is_strictly_increasing(any_session: Session) -> None:
    run = make_run(any_session, n_rows=4)
    a = queue.admit(any_session, run.id, 3, 4)
    assert a is not None
    assert queue.admit(any_session, run.id, 2, 4) is None
    b = queue.admit(any_session, run.id, 1, 4)
    assert b is not None and b[0] > a[0]
    any_session.execute(update(Run).where(Run.id == run.id).values(status="paused"))
    assert queue.admit(any_session, run.id, 0, 100) is None


def test_sweep_expires_by_database_time_and_requeues(any_session: Session) -> None:
    run = make_run(any_session, n_rows=4)
    old, old_ids = _lease_rows(any_session, run, 2, ttl=-1.0)
    live, live_ids = _lease_rows(any_session, run, 2, ttl=60.0)
    assert expiry.sweep_expired(any_session) == 1
    any_session.expire_all()
    assert any_session.get(Lease, old).state == "expired"  # type: ignore[union-attr]
    assert any_session.get(Lease, live).state == "active"  # type: ignore[union-attr]
    rows = _rows(any_session, run.id)
    assert [r.id for r in rows[:2]] == old_ids
    assert all(r.state == "queued" and r.attempts == 1 for r in rows[:2])
    assert all(r.state == "leased" for r in rows if r.id in live_ids)
    assert expiry.sweep_expired(any_session) == 0
    any_session.refresh(run)
    assert run.groups_in_flight == 2
