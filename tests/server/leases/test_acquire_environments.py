"""Grants go only to workers that can run the run's environment (declared at registration or
with the acquire), and runs whose environment requires a trusted worker only to trusted ones;
on both databases (Postgres and SQLite)."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from server.models import PromptRow, Worker
from tests.server.leases.helpers import make_run, make_worker
from tests.server.leases.lease_paths import Answered

ACQUIRE = "/api/v1/leases/acquire"
TOOLS = {"name": "tool_calls", "tools": ["calculator"], "max_turns": 2, "max_total_tokens": 512}
ALL = ["single_turn", "tool_calls", "guess_number"]


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _acquire(client: TestClient, token: str, **body: object) -> tuple[int, dict | None]:  # type: ignore[type-arg]
    response = client.post(ACQUIRE, json=body, headers=_h(token))
    return response.status_code, response.json() if response.status_code == 200 else None


def test_an_old_worker_gets_single_turn_runs_only(
    lease_client: TestClient, db: Session, answered: Answered
) -> None:
    make_run(db, environment=TOOLS, priority=5)
    plain = make_run(db)
    _, token = make_worker(db)  # declared nothing: single_turn
    db.commit()
    status, lease = _acquire(lease_client, token)
    assert status == 200 and lease is not None
    assert lease["run_id"] == str(plain.id)  # the tool_calls run, first by priority, waits
    assert lease["environment"]["name"] == "single_turn"
    status, lease = _acquire(lease_client, token)
    assert status == 200 and lease is not None and lease["run_id"] == str(plain.id)
    answered.expect({"acquire": 2})


def test_a_run_nobody_declared_waits(lease_client: TestClient, db: Session) -> None:
    make_run(db, environment=TOOLS)
    _, token = make_worker(db)
    db.commit()
    assert _acquire(lease_client, token)[0] == 204
    assert _acquire(lease_client, token, environments=["single_turn", "guess_number"])[0] == 204
    status, lease = _acquire(lease_client, token, environments=ALL)
    assert status == 200 and lease is not None
    assert lease["environment"] == {**lease["environment"], **TOOLS}


def test_the_acquire_declaration_is_kept(
    lease_client: TestClient, db: Session, answered: Answered
) -> None:
    make_run(db, environment=TOOLS)
    worker, token = make_worker(db)
    db.commit()
    assert _acquire(lease_client, token, environments=ALL)[0] == 200
    db.expire_all()
    assert db.get(Worker, worker.id).environments == ALL  # type: ignore[union-attr]
    db.rollback()  # end the read (SQLite's single writer)
    # later tries without the field use what it declared last
    assert _acquire(lease_client, token)[0] == 200
    answered.expect({"acquire": 2})


def test_module_declarations_cover_their_classes(lease_client: TestClient, db: Session) -> None:
    make_run(db, environment={"name": "my_envs.games:Maze"})
    _, token = make_worker(db)
    db.commit()
    assert _acquire(lease_client, token, environments=["single_turn", "other:*"])[0] == 204
    status, lease = _acquire(lease_client, token, environments=["my_envs.games:*"])
    assert status == 200 and lease is not None
    assert lease["environment"]["name"] == "my_envs.games:Maze"


def test_trusted_worker_required(lease_client: TestClient, db: Session) -> None:
    make_run(db, environment={"name": "guess_number", "requires_trusted_worker": True})
    worker, token = make_worker(db)
    db.commit()
    assert _acquire(lease_client, token, environments=ALL)[0] == 204
    db.execute(update(Worker).where(Worker.id == worker.id).values(trusted=True))
    db.commit()
    assert _acquire(lease_client, token, environments=ALL)[0] == 200
    # and a trusted worker still needs the environment itself
    _, other = make_worker(db, name="other")
    db.execute(update(Worker).where(Worker.name == "other").values(trusted=True))
    db.commit()
    assert _acquire(lease_client, other)[0] == 204


def test_malformed_declaration_is_422(lease_client: TestClient, db: Session) -> None:
    _, token = make_worker(db)
    db.commit()
    response = lease_client.post(ACQUIRE, json={"environments": ["a b"]}, headers=_h(token))
    assert response.status_code == 422
    assert response.json()["errors"][0]["field"].startswith("environments")


def test_prompt_too_long_counts_an_attempt_on_the_named_rows_only(
    lease_client: TestClient, db: Session
) -> None:
    """A worker whose environment cannot fit a prompt names it: it counts an attempt (and is
    dropped after max_attempts), the lease's other prompt goes back unpunished."""
    run = make_run(db, n_rows=2, environment=TOOLS, max_attempts=1)
    _, token = make_worker(db)
    db.commit()
    _, lease = _acquire(lease_client, token, environments=ALL)
    assert lease is not None
    too_long, fine = (p["prompt_row_id"] for p in lease["prompts"])
    answer = lease_client.post(
        f"/api/v1/leases/{lease['lease_id']}/release",
        json={
            "fencing": lease["fencing"],
            "reason": "prompt_too_long",
            "prompt_row_ids": [too_long],
        },
        headers=_h(token),
    )
    assert answer.status_code == 200 and answer.json() == {"released": 1}
    db.expire_all()
    rows = {
        r.id: (r.state, r.attempts, r.drop_reason)
        for r in db.execute(select(PromptRow).where(PromptRow.run_id == run.id)).scalars()
    }
    db.rollback()
    assert rows == {
        too_long: ("dropped", 1, "prompt_too_long_exhausted"),
        fine: ("queued", 0, None),
    }
    _, again = _acquire(lease_client, token)
    assert again is not None and [p["prompt_row_id"] for p in again["prompts"]] == [fine]


def test_environment_error_counts_an_attempt(lease_client: TestClient, db: Session) -> None:
    run = make_run(db, n_rows=2, environment=TOOLS, max_attempts=1)
    _, token = make_worker(db)
    db.commit()
    _, lease = _acquire(lease_client, token, environments=ALL)
    assert lease is not None
    answer = lease_client.post(
        f"/api/v1/leases/{lease['lease_id']}/release",
        json={"fencing": lease["fencing"], "reason": "environment_error"},
        headers=_h(token),
    )
    assert answer.status_code == 200 and answer.json() == {"released": 0}
    db.expire_all()
    reasons = db.execute(select(PromptRow.drop_reason).where(PromptRow.run_id == run.id)).scalars()
    assert list(reasons) == ["environment_error_exhausted"] * 2
    db.rollback()
