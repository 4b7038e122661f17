"""What a pool learner's token reaches: every per-run learner route, only on runs it holds
(others: 403 run_not_held), with the run's own learner lease and fencing as a run token has
them; revoke; the admin's list."""

from __future__ import annotations

import uuid

import pytest

from server.db import transaction
from server.models import PoolLearner
from tests.server.learner.support import make_run, run_row
from tests.server.learners.conftest import attach, lapse, register, take, taken_ids

pytestmark = pytest.mark.timeout(120)

FENCED_CALLS = [
    ("learner/heartbeat", {}),
    ("learner/fail", {"reason": "no"}),
    ("batches/claim", {"max_groups": 1}),
    ("metrics", {"points": [{"step": 1, "values": {"loss": 1.0}}]}),
    (
        "uploads",
        {"version": 1, "files": [{"name": "a", "size": 1, "sha256": "0" * 64, "kind": "adapter"}]},
    ),
    ("evals/claim", {"max_batches": 1}),
]


def test_the_pool_token_reaches_only_runs_it_holds(runs_app, runs_client) -> None:
    held, other = make_run(runs_app), make_run(runs_app)
    _, pool = register(runs_client, runs_app, max_runs=1)
    mine = taken_ids(take(runs_client, pool, 1))[0]
    theirs = other.id if mine == held.id else held.id
    refused = attach(runs_client, pool, theirs)
    assert (refused.status_code, refused.json()["code"]) == (403, "run_not_held")
    for path, body in FENCED_CALLS:
        answer = runs_client.post(
            f"/api/v1/runs/{theirs}/{path}", json={"fencing": 1, **body}, headers=pool
        )
        assert (answer.status_code, answer.json()["code"]) == (403, "run_not_held"), path
    missing = attach(runs_client, pool, uuid.uuid4())
    assert (missing.status_code, missing.json()["code"]) == (404, "run_not_found")

    attached = attach(runs_client, pool, mine)
    assert attached.status_code == 200, attached.text
    fencing = attached.json()["fencing"]
    row = run_row(runs_app, mine)
    assert row.status == "running" and row.learner_fencing == fencing
    url = f"/api/v1/runs/{mine}/learner/heartbeat"
    beat = runs_client.post(url, json={"fencing": fencing}, headers=pool)
    assert beat.status_code == 200 and beat.json()["status"] == "running"
    stale = runs_client.post(url, json={"fencing": fencing - 1}, headers=pool)
    assert (stale.status_code, stale.json()["code"]) == (409, "fencing_lost")
    again = attach(runs_client, pool, mine)  # one learner per run: its own lease is live
    assert (again.status_code, again.json()["code"]) == (409, "held_by_another_learner")
    # The run's own learner token still works the per-run way, and waits while the pool holds it.
    own = runs_client.post(
        f"/api/v1/runs/{theirs}/learner/attach",
        json={"tokenizer_fingerprint": "tok-fp-1"},
        headers=(held if theirs == held.id else other).headers,
    )
    assert own.status_code == 200


def test_last_seen_moves_on_take_and_heartbeat(runs_app, runs_client, db) -> None:
    make_run(runs_app)
    learner_id, pool = register(runs_client, runs_app)
    assert db.get(PoolLearner, learner_id).last_seen_at is None
    db.rollback()
    run_id = taken_ids(take(runs_client, pool, 1))[0]
    seen = db.get(PoolLearner, learner_id).last_seen_at
    assert seen is not None
    db.rollback()
    fencing = attach(runs_client, pool, run_id).json()["fencing"]
    url = f"/api/v1/runs/{run_id}/learner/heartbeat"

    def beat_seen() -> object:
        assert runs_client.post(url, json={"fencing": fencing}, headers=pool).status_code == 200
        with transaction(runs_app.state.sessionmaker) as session:
            return session.get(PoolLearner, learner_id).last_seen_at

    # Database time moves on: wait on the condition (a later heartbeat), never on a sleep.
    for _ in range(10_000):
        later = beat_seen()
        if later > seen:  # type: ignore[operator]
            break
    assert later > seen  # type: ignore[operator]


def test_revoke_ends_its_calls_and_frees_its_runs(runs_app, runs_client, admin) -> None:
    run = make_run(runs_app)
    learner_id, pool = register(runs_client, runs_app, name="doomed")
    _, other = register(runs_client, runs_app, name="heir")
    assert taken_ids(take(runs_client, pool, 1)) == [run.id]
    fencing = attach(runs_client, pool, run.id).json()["fencing"]
    listed = runs_client.get("/api/v1/learners", headers=admin).json()
    doomed = next(item for item in listed if item["id"] == str(learner_id))
    assert doomed["runs_held"] == [str(run.id)] and doomed["revoked"] is False
    assert doomed["gpu_type"] == "H100" and doomed["price_per_hour"] == 3.6

    revoked = runs_client.post(f"/api/v1/learners/{learner_id}/revoke", headers=admin)
    assert revoked.status_code == 200 and revoked.json()["revoked"] is True
    for path, body in [("learner/heartbeat", {"fencing": fencing})]:
        answer = runs_client.post(f"/api/v1/runs/{run.id}/{path}", json=body, headers=pool)
        assert (answer.status_code, answer.json()["code"]) == (401, "token_revoked")
    refused = runs_client.post("/api/v1/learners/take", json={"max": 1}, headers=pool)
    assert (refused.status_code, refused.json()["code"]) == (401, "token_revoked")
    assert run_row(runs_app, run.id).pool_learner_id is None
    assert taken_ids(take(runs_client, other, 1)) == [run.id]  # takeable at once
    assert attach(runs_client, other, run.id).json()["fencing"] > fencing
    again = runs_client.post(f"/api/v1/learners/{learner_id}/revoke", headers=admin)
    assert again.status_code == 200  # idempotent
    unknown = runs_client.post(f"/api/v1/learners/{uuid.uuid4()}/revoke", headers=admin)
    assert (unknown.status_code, unknown.json()["code"]) == (404, "pool_learner_not_found")
    lapse(runs_app, run.id)


def test_the_list_is_the_admins(runs_app, runs_client, admin) -> None:
    _, pool = register(runs_client, runs_app)
    assert runs_client.get("/api/v1/learners", headers=pool).status_code == 403
    assert runs_client.get("/api/v1/learners").status_code == 401
    listed = runs_client.get("/api/v1/learners", headers=admin)
    assert listed.status_code == 200 and [i["name"] for i in listed.json()] == ["pool-a"]
    assert listed.json()[0]["runs_held"] == [] and listed.json()[0]["last_seen_at"] is None
