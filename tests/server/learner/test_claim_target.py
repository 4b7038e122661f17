"""Claims for a target version (docs/architecture/contract.md, invariant 5): the learner names the
version it will train the batches into, up to current + 3; the window is measured from the
version before it, and publish never consumes a batch into a later version than its claim's.
On both databases."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from sqlalchemy import select

from server.db import transaction
from server.models import PromptRow, RolloutBatch
from tests.conftest import make_settings
from tests.harness.batches import accepted_batch
from tests.server.learner.support import (
    attach,
    batch_states,
    claim,
    expire_learner,
    make_run,
    make_worker,
    row_states,
    run_row,
    upload_and_publish,
)


@pytest.fixture
def settings(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    """Every test here on both databases."""
    return make_settings(db_url, tmp_path / "bucket")


def _batch(app, batch_id: uuid.UUID) -> RolloutBatch:  # type: ignore[no-untyped-def]
    with transaction(app.state.sessionmaker) as session:
        batch = session.get(RolloutBatch, batch_id)
        assert batch is not None
        session.expunge(batch)
        return batch


def _rows_of(app, batch_id: uuid.UUID) -> list[int]:  # type: ignore[no-untyped-def]
    with transaction(app.state.sessionmaker) as session:
        return sorted(
            session.execute(select(PromptRow.id).where(PromptRow.batch_id == batch_id)).scalars()
        )


def test_target_more_than_three_ahead_is_422(app, client) -> None:
    run = make_run(app, max_staleness=2)
    fencing = attach(client, run)["fencing"]
    assert upload_and_publish(client, run, fencing, 1).status_code == 200
    worker_id, _ = make_worker(app)
    batch = accepted_batch(app, run.id, worker_id, version=1)

    too_far = claim(client, run, fencing, target_version=5)
    assert too_far.status_code == 422, too_far.text
    assert too_far.json()["field"] == "target_version"
    assert "at most current_version + 3 = 4" in too_far.json()["detail"]
    assert batch_states(app, run.id) == {batch: "accepted"}  # nothing claimed

    zero = claim(client, run, fencing, target_version=0)
    assert zero.status_code == 422
    assert [e["field"] for e in zero.json()["errors"]] == ["target_version"]

    furthest = claim(client, run, fencing, target_version=4)
    assert furthest.status_code == 200, furthest.text
    (claimed,) = furthest.json()["batches"]
    assert (claimed["target_version"], claimed["staleness"]) == (4, 2)


def test_target_a_publish_has_reached_is_409(app, client) -> None:
    run = make_run(app, max_staleness=2)
    fencing = attach(client, run)["fencing"]
    worker_id, _ = make_worker(app)
    assert claim(client, run, fencing, target_version=1).status_code == 200
    assert upload_and_publish(client, run, fencing, 1).status_code == 200
    batch = accepted_batch(app, run.id, worker_id, version=1)

    behind = claim(client, run, fencing, target_version=1)
    assert behind.status_code == 409, behind.text
    body = behind.json()
    assert (body["current_version"], body["target_version"]) == (1, 1)
    assert "publish landed" in body["detail"]
    assert batch_states(app, run.id) == {batch: "accepted"}
    assert run_row(app, run.id).learner_fencing == fencing  # not a lost lease: claim on
    assert claim(client, run, fencing, target_version=2).json()["batches"][0]["batch_id"] == str(
        batch
    )


def test_window_is_measured_from_the_version_before_the_target(app, client) -> None:
    run = make_run(app, max_staleness=1, max_attempts=3)
    fencing = attach(client, run)["fencing"]
    assert upload_and_publish(client, run, fencing, 1).status_code == 200
    worker_id, _ = make_worker(app)
    on_v0 = accepted_batch(app, run.id, worker_id, version=0)
    on_v1 = accepted_batch(app, run.id, worker_id, version=1)
    v0_rows = _rows_of(app, on_v0)

    # Into version 3 (trained on top of 2): v0 lags 2 > max_staleness 1, v1 lags 1.
    body = claim(client, run, fencing, target_version=3).json()
    assert body["stale_rejected"] == 1
    assert [(b["batch_id"], b["staleness"], b["target_version"]) for b in body["batches"]] == [
        (str(on_v1), 1, 3)
    ]
    rejected = _batch(app, on_v0)
    assert (rejected.state, rejected.reject_reason, rejected.staleness) == ("rejected", "stale", 2)
    assert rejected.target_version == 3
    states = row_states(app, run.id)
    assert [states[r] for r in v0_rows] == [("queued", 1, None)] * 2
    claimed = _batch(app, on_v1)
    assert (claimed.state, claimed.staleness, claimed.target_version) == ("claimed", 1, 3)

    # The same lag into the next version (no target: current + 1 = 2) is inside the window.
    again_v0 = accepted_batch(app, run.id, worker_id, version=0)
    assert _rows_of(app, again_v0) == v0_rows
    plain = claim(client, run, fencing).json()
    assert plain["stale_rejected"] == 0
    assert [(b["batch_id"], b["staleness"], b["target_version"]) for b in plain["batches"]] == [
        (str(again_v0), 1, 2)
    ]
    assert _batch(app, again_v0).target_version == 2


def test_publish_refuses_a_batch_claimed_for_an_earlier_version(app, client) -> None:
    run = make_run(app, max_staleness=2)
    fencing = attach(client, run)["fencing"]
    worker_id, _ = make_worker(app)
    for_v1 = accepted_batch(app, run.id, worker_id, version=0)
    assert claim(client, run, fencing).json()["batches"][0]["target_version"] == 1
    for_v3 = accepted_batch(app, run.id, worker_id, version=0)
    assert claim(client, run, fencing, target_version=3).json()["batches"][0]["staleness"] == 2

    # Earlier than planned is fine: the batch is trained less far behind.
    early = upload_and_publish(client, run, fencing, 1, [for_v3])
    assert early.status_code == 200, early.text
    # Later than planned is not: for_v1 would go into version 2, one version further behind.
    late = upload_and_publish(client, run, fencing, 2, [for_v1])
    assert late.status_code == 409, late.text
    assert late.json()["batch_ids"] == [str(for_v1)]
    assert run_row(app, run.id).current_version == 1
    assert batch_states(app, run.id) == {for_v1: "claimed", for_v3: "consumed"}


def test_attach_releases_claims_with_their_targets(app, client) -> None:
    run = make_run(app, max_staleness=2)
    fencing = attach(client, run)["fencing"]
    worker_id, _ = make_worker(app)
    batch = accepted_batch(app, run.id, worker_id, version=0)
    assert claim(client, run, fencing, target_version=2).status_code == 200
    expire_learner(app, run.id)
    second = attach(client, run)["fencing"]
    released = _batch(app, batch)
    assert (released.state, released.staleness, released.target_version) == ("accepted", None, None)
    (again,) = claim(client, run, second).json()["batches"]
    assert (again["target_version"], again["staleness"]) == (1, 0)


def test_target_past_max_versions_is_exhausted(app, client) -> None:
    run = make_run(app, max_versions=2)
    fencing = attach(client, run)["fencing"]
    worker_id, _ = make_worker(app)
    batch = accepted_batch(app, run.id, worker_id, version=0)
    past = claim(client, run, fencing, target_version=3).json()
    assert (past["batches"], past["exhausted"]) == ([], True)
    assert batch_states(app, run.id) == {batch: "accepted"}
    last = claim(client, run, fencing, target_version=2).json()
    assert [b["batch_id"] for b in last["batches"]] == [str(batch)]
