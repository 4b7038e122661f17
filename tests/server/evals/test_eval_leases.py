"""Eval leases beside training (SQLite and Postgres): their own bound, no starvation of
training, pinned versions (no stale abort, kept by retention), lost leases re-queued and fenced,
bad results refused."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from sqlalchemy import select, update

from server.db import transaction
from server.db_types import db_now_plus
from server.learner.retention import apply_retention
from server.models import AdapterVersion, EvalItem, Lease, Run
from tests.conftest import make_settings
from tests.server.evals.support import acquire, finish, make_eval_run, worker_headers
from tests.server.learner.support import (
    RunHandle,
    attach,
    claim,
    make_worker,
    upload_and_publish,
)


@pytest.fixture
def settings(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    return make_settings(db_url, tmp_path / "bucket")


def _run_row(app, run_id: uuid.UUID) -> Run:  # type: ignore[no-untyped-def]
    with transaction(app.state.sessionmaker) as session:
        run = session.get(Run, run_id)
        assert run is not None
        session.expunge(run)
        return run


def _items(app, run_id: uuid.UUID) -> dict[str, int]:  # type: ignore[no-untyped-def]
    with transaction(app.state.sessionmaker) as session:
        states = session.execute(select(EvalItem.state).where(EvalItem.run_id == run_id)).scalars()
        out: dict[str, int] = {}
        for s in states:
            out[s] = out.get(s, 0) + 1
        return out


def test_eval_has_its_own_bound_and_training_is_not_starved(app, client) -> None:
    # bound: (1 + 1) × 1 × 8 = 16 groups = 8 training leases of 2 prompts
    run = make_eval_run(app, n_rows=16, prompts_per_step=8)
    _, token = make_worker(app)
    worker = worker_headers(token)
    attach(client, run)
    kinds = []
    while (lease := acquire(client, worker)) is not None:
        kinds.append(lease["kind"])
        assert len(kinds) < 20
    # training first, eval on the run's 4th grant (its fencing sequence) while training is
    # still admissible; eval's bound is 1 lease, training's is its own
    assert kinds.count("train") == 8 and kinds.count("eval") == 1
    assert kinds.index("eval") == 2
    row = _run_row(app, run.id)
    assert row.groups_in_flight == 8 * 2  # the eval lease's prompts are not counted
    assert _items(app, run.id) == {"leased": 2, "queued": 1}


def test_eval_gets_leases_when_training_is_at_its_bound(app, client) -> None:
    run = make_eval_run(
        app, n_rows=4, prompts_per_step=2, eval_overrides={"max_leases_in_flight": 2}
    )
    _, token = make_worker(app)
    worker = worker_headers(token)
    attach(client, run)
    leases = []
    while (lease := acquire(client, worker)) is not None:
        leases.append(lease)
    # bound 4 groups = 2 training leases; then eval takes the rest (3 items, 2 per lease)
    assert [x["kind"] for x in leases] == ["train", "train", "eval", "eval"]
    assert sum(len(x["prompts"]) for x in leases if x["kind"] == "eval") == 3


def _publish_versions(client, run: RunHandle, fencing: int, upto: int) -> None:  # type: ignore[no-untyped-def]
    for version in range(1, upto + 1):
        published = upload_and_publish(client, run, fencing, version)
        assert published.status_code == 200, published.text


def test_eval_lease_is_pinned_never_stale_and_its_version_kept(app, client) -> None:
    run = make_eval_run(app, n_rows=8, max_staleness=0, eval_overrides={"every_versions": 1})
    _, token = make_worker(app)
    worker = worker_headers(token)
    fencing = attach(client, run)["fencing"]
    _publish_versions(client, run, fencing, 1)  # version 1 due (every version)
    held = []
    while (lease := acquire(client, worker)) is not None:
        held.append(lease)
    evals = [x for x in held if x["kind"] == "eval"]
    assert evals and evals[0]["adapter_version"] == 0
    _publish_versions_from(client, run, fencing, 2, 4)
    beat = client.post(
        f"/api/v1/leases/{evals[0]['lease_id']}/heartbeat",
        json={"fencing": evals[0]["fencing"]},
        headers=worker,
    ).json()
    assert beat["abort"] is False and beat["current_version"] == 4  # 4 versions behind
    # retention: every version's eval is pending (every_versions 1), so none is deleted
    with transaction(app.state.sessionmaker) as session:
        apply_retention(session, app.state.store, run.id)
        deleted = set(
            session.execute(
                select(AdapterVersion.version).where(
                    AdapterVersion.run_id == run.id, AdapterVersion.deleted.is_(True)
                )
            ).scalars()
        )
    assert deleted == set()
    done = finish(client, worker, evals[0])
    assert done.status_code == 200 and done.json()["state"] == "accepted", done.text


def _publish_versions_from(client, run, fencing, start, end) -> None:  # type: ignore[no-untyped-def]
    for version in range(start, end + 1):
        published = upload_and_publish(client, run, fencing, version)
        assert published.status_code == 200, published.text


def test_retention_keeps_a_version_with_eval_pending(app, client) -> None:
    run = make_eval_run(app, n_rows=8, max_staleness=0, eval_overrides={"every_versions": 2})
    fencing = attach(client, run)["fencing"]
    _publish_versions(client, run, fencing, 4)  # due: 0, 2, 4; 1 and 3 are not
    with transaction(app.state.sessionmaker) as session:
        apply_retention(session, app.state.store, run.id)
        deleted = set(
            session.execute(
                select(AdapterVersion.version).where(
                    AdapterVersion.run_id == run.id, AdapterVersion.deleted.is_(True)
                )
            ).scalars()
        )
    # 3 and 4 are inside the window; 2 is outside it but its eval is pending; 1 is not due
    assert deleted == {1}


def test_expired_eval_lease_is_requeued_and_its_late_upload_refused(app, client) -> None:
    run = make_eval_run(
        app, n_rows=2, prompts_per_step=2, eval_overrides={"max_leases_in_flight": 4}
    )
    _, token = make_worker(app)
    worker = worker_headers(token)
    attach(client, run)
    leases = []
    while (lease := acquire(client, worker)) is not None:
        leases.append(lease)
    lost = next(x for x in leases if x["kind"] == "eval")
    with transaction(app.state.sessionmaker) as session:
        session.execute(
            update(Lease)
            .where(Lease.id == uuid.UUID(lost["lease_id"]))
            .values(expires_at=db_now_plus(-5))
        )
    again = acquire(client, worker)  # the sweep re-queues its items, granted again at once
    assert again is not None and again["kind"] == "eval"
    assert {p["prompt_row_id"] for p in again["prompts"]} == {
        p["prompt_row_id"] for p in lost["prompts"]
    }
    late = finish(client, worker, lost)
    assert late.status_code == 409, late.text
    with transaction(app.state.sessionmaker) as session:
        attempts = set(
            session.execute(
                select(EvalItem.attempts).where(
                    EvalItem.id.in_([p["prompt_row_id"] for p in lost["prompts"]])
                )
            ).scalars()
        )
    assert attempts == {1}


def test_rejected_eval_batch_requeues_and_bad_results_are_refused(app, client) -> None:
    run = make_eval_run(
        app, n_rows=2, prompts_per_step=2, eval_overrides={"max_leases_in_flight": 4}
    )
    _, token = make_worker(app)
    worker = worker_headers(token)
    fencing = attach(client, run)["fencing"]
    while (lease := acquire(client, worker)) is not None:
        assert finish(client, worker, lease).status_code == 200
    train = claim(client, run, fencing).json()["batches"]
    assert train and all(b["prompts"][0]["epoch"] == 0 for b in train)
    body = client.post(
        run.url("evals/claim"), json={"fencing": fencing, "max_batches": 64}, headers=run.headers
    ).json()
    assert len(body["batches"]) == 2 and body["pending_versions"] == 1
    first, second = body["batches"]
    # one sample short: 422 naming samples, nothing scored
    item = first["prompts"][0]["item_id"]
    short = client.post(
        run.url("evals"),
        json={
            "fencing": fencing,
            "batch_id": first["batch_id"],
            "samples": [{"item_id": item, "reward": 1.0, "accuracy_value": 1.0}],
        },
        headers=run.headers,
    )
    assert short.status_code == 422 and "samples" in short.text
    stale = client.post(
        run.url("evals"),
        json={
            "fencing": fencing - 1,
            "batch_id": first["batch_id"],
            "samples": [{"item_id": item, "reward": 1.0, "accuracy_value": 1.0}],
        },
        headers=run.headers,
    )
    assert stale.status_code == 409
    rejected = client.post(
        run.url(f"batches/{second['batch_id']}/reject"),
        json={"fencing": fencing, "reason": "invalid", "detail": "test"},
        headers=run.headers,
    )
    assert rejected.status_code == 200 and rejected.json()["requeued"] == len(second["prompts"])
    assert _items(app, run.id)["queued"] == len(second["prompts"])


def test_a_run_without_eval_has_no_eval_results(app, client, admin_headers) -> None:
    from tests.server.learner.support import make_run

    run = make_run(app)
    attach(client, run)
    got = client.get(run.url("evals"), headers=admin_headers).json()
    assert got["enabled"] is False and got["versions"] == []
    assert (
        client.get(f"/api/v1/runs/{uuid.uuid4()}/evals", headers=admin_headers).status_code == 404
    )


def test_a_learner_reattaching_while_evaluating_is_told_so(app, client) -> None:  # type: ignore[no-untyped-def]
    run = make_eval_run(app, n_rows=2, prompts_per_step=2)
    _, token = make_worker(app)
    worker = worker_headers(token)
    fencing = attach(client, run)["fencing"]
    train = acquire(client, worker)
    assert train is not None and train["kind"] == "train"
    assert finish(client, worker, train).json()["state"] == "accepted"
    batches = [b["batch_id"] for b in claim(client, run, fencing).json()["batches"]]
    published = upload_and_publish(client, run, fencing, 1, batches, final=True)
    assert published.json()["run_status"] == "evaluating"
    with transaction(app.state.sessionmaker) as session:  # the learner died: its lease lapses
        session.execute(
            update(Run).where(Run.id == run.id).values(learner_expires_at=db_now_plus(-1))
        )
    again = attach(client, run)
    assert again["run_status"] == "evaluating" and again["fencing"] > fencing
    body = client.post(run.url("evals/claim"), json={"fencing": fencing}, headers=run.headers)
    assert body.status_code == 409  # the old token is fenced out
    body = client.post(
        run.url("evals/claim"), json={"fencing": again["fencing"]}, headers=run.headers
    )
    assert body.status_code == 200 and body.json()["pending_versions"] == 2  # 0 and 1
    assert body.json()["run_status"] == "evaluating"


def test_a_refused_eval_grant_writes_nothing(app, client) -> None:
    """At eval's bound (and training's), a refused grant leaves the run's fencing sequence
    and last_lease_at as they were: a long-poll try does not push the run back in the fairness
    order nor shift the eval cadence (it once raised both before counting)."""
    run = make_eval_run(app, n_rows=4, prompts_per_step=2)
    _, token = make_worker(app)
    worker = worker_headers(token)
    attach(client, run)
    kinds = []
    while (lease := acquire(client, worker)) is not None:
        kinds.append(lease["kind"])
    assert kinds == ["train", "train", "eval"]  # both bounds reached; eval items still queued
    assert _items(app, run.id)["queued"] == 1
    before = _run_row(app, run.id)
    for _ in range(3):
        assert acquire(client, worker) is None
    after = _run_row(app, run.id)
    assert (after.fencing_seq, after.last_lease_at) == (before.fencing_seq, before.last_lease_at)
