"""The staleness window at claim (invariant 5) and the closing of an epoch (invariant 12)."""

from __future__ import annotations

from sqlalchemy import select

from server.db import transaction
from server.models import PromptRow, RolloutBatch
from tests.harness.batches import accepted_batch
from tests.server.learner.support import (
    attach,
    claim,
    make_run,
    make_worker,
    row_states,
    run_row,
    upload_and_publish,
)


def _rows_of(app, batch_id) -> list[int]:  # type: ignore[no-untyped-def]
    with transaction(app.state.sessionmaker) as session:
        return sorted(
            session.execute(select(PromptRow.id).where(PromptRow.batch_id == batch_id)).scalars()
        )


def _publish(client, run, fencing, version, batches=()) -> None:  # type: ignore[no-untyped-def]
    response = upload_and_publish(client, run, fencing, version, list(batches))
    assert response.status_code == 200, response.text


def test_stale_batches_requeued_then_dropped_epoch_closes(app, client, admin_headers) -> None:
    run = make_run(app, max_staleness=1, max_attempts=2)
    fencing = attach(client, run)["fencing"]
    worker_id, _ = make_worker(app)

    old = accepted_batch(app, run.id, worker_id, version=0)
    first_rows = _rows_of(app, old)
    _publish(client, run, fencing, 1)
    _publish(client, run, fencing, 2)
    body = claim(client, run, fencing).json()
    assert body["batches"] == [] and body["stale_rejected"] == 1 and body["exhausted"] is False
    with transaction(app.state.sessionmaker) as session:
        rejected = session.get(RolloutBatch, old)
        assert rejected is not None
        assert (rejected.state, rejected.reject_reason, rejected.staleness) == (
            "rejected",
            "stale",
            2,
        )
    states = row_states(app, run.id)
    assert [states[r] for r in first_rows] == [("queued", 1, None)] * 2
    assert run_row(app, run.id).groups_in_flight == 0

    # The prompts come back from the front of the queue; stale again, they are dropped.
    retry = accepted_batch(app, run.id, worker_id, version=2)
    assert _rows_of(app, retry) == first_rows
    _publish(client, run, fencing, 3)
    _publish(client, run, fencing, 4)
    assert claim(client, run, fencing).json()["stale_rejected"] == 1
    states = row_states(app, run.id)
    assert [states[r] for r in first_rows] == [("dropped", 2, "stale_exhausted")] * 2

    # The rest of the epoch is trained on; then nothing is left: exhausted.
    fresh = accepted_batch(app, run.id, worker_id, version=4)
    last = claim(client, run, fencing).json()
    assert [b["batch_id"] for b in last["batches"]] == [str(fresh)]
    assert last["batches"][0]["staleness"] == 0
    assert last["exhausted"] is True
    assert claim(client, run, fencing).json()["exhausted"] is True
    _publish(client, run, fencing, 5, [fresh])
    done = upload_and_publish(client, run, fencing, 6, final=True)
    assert done.json()["run_status"] == "completed"

    ledger = client.get(run.url("ledger"), headers=admin_headers).json()
    assert ledger["balanced"] is True and ledger["total"] == 4
    assert ledger["by_state"] == {"consumed": 2, "dropped": 2}
    assert ledger["dropped_by_reason"] == {"stale_exhausted": 2}
    assert [e["closed"] for e in ledger["epochs"]] == [True]

    metrics = client.get(run.url("metrics"), headers=admin_headers).json()
    proxy = metrics["proxy"]
    assert proxy["rejected_by_reason"] == {"stale": 2}
    assert proxy["samples_generated"] == 12 and proxy["samples_rejected_stale"] == 8
    assert abs(proxy["stale_waste"] - 8 / 12) < 1e-9
    assert proxy["staleness_histogram"] == {"0": 1}


def test_exhausted_waits_for_rows_in_flight(app, client) -> None:
    run = make_run(app)
    fencing = attach(client, run)["fencing"]
    worker_id, _ = make_worker(app)
    a = accepted_batch(app, run.id, worker_id, version=0)
    first = claim(client, run, fencing).json()
    assert [b["batch_id"] for b in first["batches"]] == [str(a)]
    assert first["exhausted"] is False  # two rows still queued
    b = accepted_batch(app, run.id, worker_id, version=0)
    second = claim(client, run, fencing).json()
    assert [x["batch_id"] for x in second["batches"]] == [str(b)]
    assert second["exhausted"] is True
