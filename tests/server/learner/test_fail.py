"""The learner's failure report (docs/architecture/run-lifecycle.md, "Run lifecycle": fail): the run
becomes `failed` with the reason and a `run.failed` event; everything fenced after it answers
409."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select

from server.db import transaction
from server.models import Event
from tests.conftest import mint_token
from tests.server.learner.support import attach, claim, make_run, make_worker, run_row

REASON = "reward: cannot import reward module 'nope'"


def _fail(client: TestClient, run: Any, fencing: int, reason: str = REASON) -> Any:
    return client.post(
        run.url("learner/fail"), json={"fencing": fencing, "reason": reason}, headers=run.headers
    )


def test_fail_ends_the_run_with_the_reason_and_an_event(app: Any, client: TestClient) -> None:
    run = make_run(app)
    fencing = attach(client, run)["fencing"]
    answer = _fail(client, run, fencing)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"run_status": "failed"}
    row = run_row(app, run.id)
    assert (row.status, row.status_reason) == ("failed", REASON)
    with transaction(app.state.sessionmaker) as session:
        events = session.execute(
            select(Event.kind, Event.severity, Event.data).where(
                Event.run_id == run.id, Event.severity != "info"
            )
        ).all()
    assert [(e.kind, e.severity, e.data["reason"]) for e in events] == [
        ("run.failed", "critical", REASON)
    ]
    # A failed run has ended: the learner's fenced calls, a second report and attach are 409.
    assert claim(client, run, fencing).status_code == 409
    assert _fail(client, run, fencing).status_code == 409
    again = client.post(
        run.url("learner/attach"), json={"tokenizer_fingerprint": "x"}, headers=run.headers
    )
    assert again.status_code == 409 and again.json()["status"] == "failed"
    assert run_row(app, run.id).status_reason == REASON


def test_fail_is_fenced_and_authorized(app: Any, client: TestClient) -> None:
    run = make_run(app)
    other = make_run(app)
    fencing = attach(client, run)["fencing"]
    assert _fail(client, run, fencing + 1).status_code == 409
    _worker_id, worker_token = make_worker(app)
    as_worker = client.post(
        run.url("learner/fail"),
        json={"fencing": fencing, "reason": "x"},
        headers={"Authorization": f"Bearer {worker_token}"},
    )
    assert as_worker.status_code == 403
    admin = mint_token(app, "admin", name="a")
    as_admin = client.post(
        run.url("learner/fail"),
        json={"fencing": fencing, "reason": "x"},
        headers={"Authorization": f"Bearer {admin}"},
    )
    assert as_admin.status_code == 403
    foreign = client.post(
        run.url("learner/fail"), json={"fencing": fencing, "reason": "x"}, headers=other.headers
    )
    assert foreign.status_code == 404
    assert run_row(app, run.id).status == "running"


def test_fail_refuses_bad_bodies(app: Any, client: TestClient) -> None:
    run = make_run(app)
    fencing = attach(client, run)["fencing"]
    for body, field in [
        ({"fencing": fencing, "reason": ""}, "reason"),
        ({"fencing": fencing, "reason": "x" * 2001}, "reason"),
        ({"fencing": fencing}, "reason"),
        ({"fencing": fencing, "reason": "x", "extra": 1}, "extra"),
        ({"fencing": -1, "reason": "x"}, "fencing"),
    ]:
        answer = client.post(run.url("learner/fail"), json=body, headers=run.headers)
        assert answer.status_code == 422, answer.text
        assert answer.json()["errors"][0]["field"] == field
    assert run_row(app, run.id).status == "running"
