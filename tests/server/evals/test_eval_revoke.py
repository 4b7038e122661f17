"""Revoking a worker that holds an eval lease (SQLite and Postgres): the lease ends `revoked`
and its eval items go back to their queue at once with no attempt counted, for another worker."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from sqlalchemy import select

from server.db import transaction
from server.models import EvalItem, Lease
from tests.conftest import make_settings, mint_token
from tests.server.evals.support import acquire, make_eval_run, worker_headers
from tests.server.learner.support import attach, make_worker


@pytest.fixture
def settings(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    return make_settings(db_url, tmp_path / "bucket")


def test_revoking_a_worker_requeues_its_eval_items_without_an_attempt(app, client) -> None:  # type: ignore[no-untyped-def]
    run = make_eval_run(
        app, n_rows=2, prompts_per_step=2, eval_overrides={"max_leases_in_flight": 4}
    )
    revoked_id, token = make_worker(app)
    _, other_token = make_worker(app)
    attach(client, run)
    leases = []
    while (lease := acquire(client, worker_headers(token))) is not None:
        leases.append(lease)
    held = next(x for x in leases if x["kind"] == "eval")
    items = [p["prompt_row_id"] for p in held["prompts"]]

    admin = {"Authorization": f"Bearer {mint_token(app, 'admin', name='admin')}"}
    answer = client.post(f"/api/v1/workers/{revoked_id}/revoke", headers=admin)

    assert answer.status_code == 200, answer.text
    with transaction(app.state.sessionmaker) as session:
        ended = session.get(Lease, uuid.UUID(held["lease_id"]))
        assert ended is not None and (ended.state, ended.end_reason) == ("aborted", "revoked")
        found = session.execute(
            select(EvalItem.state, EvalItem.attempts).where(EvalItem.id.in_(items))
        ).all()
    assert {(state, attempts) for state, attempts in found} == {("queued", 0)}
    again = None
    while (lease := acquire(client, worker_headers(other_token))) is not None:
        if lease["kind"] == "eval":
            again = lease
            break
    assert again is not None
    assert [p["prompt_row_id"] for p in again["prompts"]] == items
