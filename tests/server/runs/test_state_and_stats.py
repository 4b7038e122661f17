"""Listing, live stats and the admin state machine (pause / resume / cancel)."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from server.db_types import db_now, db_now_plus
from server.models import CostRecord, Lease, PromptRow, RolloutBatch, Run, Worker
from server.runs.lifecycle import ADMIN_ACTIONS, RESUME, STATUSES, TRANSITIONS
from tests.server.runs.conftest import example_config


def create(client: Any, admin: dict[str, str], **overrides: Any) -> str:
    resp = client.post("/api/v1/runs", json=example_config(**overrides), headers=admin)
    assert resp.status_code == 201, resp.text
    return str(resp.json()["run"]["id"])


def set_status(db: Session, run_id: str, status: str, *, attached: bool = False) -> None:
    db.execute(
        update(Run)
        .where(Run.id == uuid.UUID(run_id))
        .values(status=status, learner_attached_at=db_now() if attached else None)
    )
    db.commit()


def test_list_filters_by_status(runs_client, admin, db: Session) -> None:  # type: ignore[no-untyped-def]
    a = create(runs_client, admin, name="a")
    b = create(runs_client, admin, name="b")
    set_status(db, b, "running", attached=True)
    listed = runs_client.get("/api/v1/runs", headers=admin).json()
    assert {r["id"] for r in listed} == {a, b}
    assert all("config" not in r for r in listed)
    running = runs_client.get("/api/v1/runs?status=running", headers=admin).json()
    assert [r["id"] for r in running] == [b]
    assert runs_client.get("/api/v1/runs?status=completed", headers=admin).json() == []
    bad = runs_client.get("/api/v1/runs?status=sleeping", headers=admin)
    assert bad.status_code == 422
    assert bad.json()["errors"][0]["field"] == "query.status"
    page = runs_client.get("/api/v1/runs?limit=1", headers=admin).json()
    assert len(page) == 1


def test_unknown_run_is_404(runs_client, admin) -> None:  # type: ignore[no-untyped-def]
    missing = uuid.uuid4()
    assert runs_client.get(f"/api/v1/runs/{missing}", headers=admin).status_code == 404
    for action in ADMIN_ACTIONS:
        resp = runs_client.post(f"/api/v1/runs/{missing}/{action}", headers=admin)
        assert resp.status_code == 404
    assert runs_client.get("/api/v1/runs/not-a-uuid", headers=admin).status_code == 422


def test_transition_table(runs_client, admin, db: Session) -> None:  # type: ignore[no-untyped-def]
    """Every action from every state: allowed moves land where the table says, the others
    are 409 with the reason and change nothing."""
    run_id = create(runs_client, admin)
    for attached in (False, True):
        for status in STATUSES:
            for action in ADMIN_ACTIONS:
                rule = TRANSITIONS[action]
                set_status(db, run_id, status, attached=attached)
                resp = runs_client.post(
                    f"/api/v1/runs/{run_id}/{action}", json={"reason": "test"}, headers=admin
                )
                now = db.execute(select(Run.status).where(Run.id == uuid.UUID(run_id)))
                current = now.scalar_one()
                db.rollback()
                if status in rule.from_states:
                    expected = rule.to_status
                    if expected == RESUME:
                        expected = "running" if attached else "pending"
                    assert resp.status_code == 200, (status, action, resp.text)
                    assert resp.json()["status"] == current == expected
                    assert resp.json()["status_reason"] == "test"
                else:
                    assert resp.status_code == 409, (status, action, resp.text)
                    body = resp.json()
                    assert body["status"] == status and body["action"] == action
                    assert f"cannot {action} a run that is {status}" in body["detail"]
                    assert current == status


def test_pause_resume_cancel_without_body(runs_client, admin) -> None:  # type: ignore[no-untyped-def]
    run_id = create(runs_client, admin)
    url = f"/api/v1/runs/{run_id}"
    assert runs_client.post(f"{url}/pause", headers=admin).json()["status"] == "paused"
    again = runs_client.post(f"{url}/pause", headers=admin)
    assert again.status_code == 409
    assert "pause needs one of: pending, running" in again.json()["detail"]
    assert runs_client.post(f"{url}/resume", headers=admin).json()["status"] == "pending"
    assert runs_client.post(f"{url}/cancel", headers=admin).json()["status"] == "cancelled"
    ended = runs_client.post(f"{url}/resume", headers=admin)
    assert ended.status_code == 409 and "it has ended" in ended.json()["detail"]
    unknown_field = runs_client.post(f"{url}/cancel", json={"why": "x"}, headers=admin)
    assert unknown_field.status_code == 422


def _arrange_activity(db: Session, run_id: uuid.UUID) -> None:
    worker = Worker(name="w1")
    db.add(worker)
    db.flush()

    def lease(state: str, expires_in: float) -> Lease:
        row = Lease(
            run_id=run_id,
            worker_id=worker.id,
            adapter_version=0,
            fencing=1,
            state=state,
            expires_at=db_now_plus(expires_in),
            seed=0,
            n_prompts=2,
            group_size=8,
        )
        db.add(row)
        db.flush()
        return row

    lease("active", 300)
    lease("active", -5)  # expired but not yet swept: not counted as active
    for state, reason in [
        ("accepted", None),
        ("rejected", "stale"),
        ("rejected", "stale"),
        ("rejected", "checksum"),
        ("consumed", None),
    ]:
        done = lease("completed", 0)
        db.add(
            RolloutBatch(
                run_id=run_id,
                lease_id=done.id,
                worker_id=worker.id,
                adapter_version=0,
                bucket_key=f"k/{done.id}",
                sha256="0" * 64,
                bytes=10,
                n_samples=16,
                n_tokens=100,
                n_groups=2,
                state=state,
                reject_reason=reason,
            )
        )
    ids = (
        db.execute(
            select(PromptRow.id).where(PromptRow.run_id == run_id).order_by(PromptRow.queue_pos)
        )
        .scalars()
        .all()
    )
    db.execute(
        update(PromptRow)
        .where(PromptRow.id.in_(ids[:3]))
        .values(state="dropped", drop_reason="stale_exhausted")
    )
    db.execute(
        update(PromptRow)
        .where(PromptRow.id == ids[3])
        .values(state="dropped", drop_reason="expired_exhausted")
    )
    db.execute(update(PromptRow).where(PromptRow.id.in_(ids[4:6])).values(state="leased"))
    for kind, usd in [("worker", 1.25), ("worker", 0.75), ("learner", 0.5)]:
        db.add(
            CostRecord(
                run_id=run_id,
                kind=kind,
                seconds=60,
                usd=usd,
                period_start=db_now(),
                period_end=db_now(),
            )
        )
    db.execute(
        update(Run)
        .where(Run.id == run_id)
        .values(
            spent_usd=2.5, current_version=3, groups_in_flight=2, learner_expires_at=db_now_plus(30)
        )
    )
    db.commit()


def test_live_stats(runs_client, admin, db: Session) -> None:  # type: ignore[no-untyped-def]
    run_id = create(runs_client, admin, budget_usd=10.0)
    _arrange_activity(db, uuid.UUID(run_id))
    stats = runs_client.get(f"/api/v1/runs/{run_id}", headers=admin).json()["stats"]
    size = example_config()["dataset"]["size"]
    assert stats["prompt_rows"] == {"dropped": 4, "leased": 2, "queued": size - 6}
    assert stats["dropped"] == {"stale_exhausted": 3, "expired_exhausted": 1}
    assert stats["batches"] == {"accepted": 1, "rejected": 3, "consumed": 1}
    assert stats["rejected"] == {"stale": 2, "checksum": 1}
    assert stats["active_leases"] == 1
    assert stats["current_version"] == 3
    assert stats["groups_in_flight"] == 2
    assert stats["learner_attached"] is True
    assert stats["spend"] == {
        "total_usd": 2.5,
        "workers_usd": 2.0,
        "learner_usd": 0.5,
        "budget_usd": 10.0,
    }
