"""Sparse checkpoints (docs/architecture/contract.md, invariants 7 and 13): a version may carry no
checkpoint files; attach pairs the current version's adapter and learner step with the latest
checkpoint at or below it, and retention keeps that one. On both databases."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from server.db import transaction
from server.models import AdapterVersion
from tests.conftest import make_settings
from tests.harness.batches import accepted_batch
from tests.server.learner.support import (
    attach,
    claim,
    deleted_versions,
    expire_learner,
    make_run,
    make_worker,
    publish_body,
    retain,
    run_row,
    upload,
    upload_and_publish,
    version_keys,
)


@pytest.fixture
def settings(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    return make_settings(db_url, tmp_path / "bucket")


def test_publish_without_checkpoint_files(app, client) -> None:
    """A version between checkpoints carries none (an empty list or the field left out)."""
    run = make_run(app)
    fencing = attach(client, run)["fencing"]
    worker_id, _ = make_worker(app)
    batch = accepted_batch(app, run.id, worker_id, version=0)
    claim(client, run, fencing)
    empty = upload_and_publish(client, run, fencing, 1, [batch], checkpoint=False)
    assert empty.status_code == 200, empty.text
    assert empty.json()["consumed_batches"] == 1
    assert upload(client, run, fencing, 2, checkpoint=False).status_code == 200
    body = publish_body(run, fencing, 2, checkpoint=False)
    del body["checkpoint_files"]
    left_out = client.post(run.url("adapters"), json=body, headers=run.headers)
    assert left_out.status_code == 200, left_out.text
    with transaction(app.state.sessionmaker) as session:
        rows = session.execute(
            select(AdapterVersion.version, AdapterVersion.checkpoint_files).where(
                AdapterVersion.run_id == run.id
            )
        ).all()
    assert sorted((v, c) for v, c in rows) == [(1, {}), (2, {})]
    assert run_row(app, run.id).current_version == 2


def test_reattach_between_checkpoints_returns_the_latest_older_one(app, client) -> None:
    """Versions between checkpoints carry none: attach pairs the current version's adapter and
    learner step with the latest checkpoint below it, naming that checkpoint's version."""
    run = make_run(app)
    fencing = attach(client, run)["fencing"]
    for version, checkpoint in ((1, True), (2, True), (3, False), (4, False)):
        published = upload_and_publish(client, run, fencing, version, checkpoint=checkpoint)
        assert published.status_code == 200, published.text
    expire_learner(app, run.id)
    body = attach(client, run)
    assert body["current_version"] == 4
    assert (body["resume_checkpoint_version"], body["resume_learner_step"]) == (2, 4)
    (state,) = body["resume_checkpoint"]
    assert state["key"] == f"runs/{run.id}/checkpoints/v000002/trainer_state.json"
    assert b'"step": 2' in client.get(state["url"]).content
    adapter = {f["name"]: f for f in body["resume_adapter"]}
    assert adapter["adapter_config.json"]["key"].endswith("/adapters/v000004/adapter_config.json")
    assert b'"v": 4' in client.get(adapter["adapter_config.json"]["url"]).content


def test_reattach_with_no_checkpoint_yet_says_so(app, client) -> None:
    run = make_run(app)
    fencing = attach(client, run)["fencing"]
    assert upload_and_publish(client, run, fencing, 1, checkpoint=False).status_code == 200
    expire_learner(app, run.id)
    body = attach(client, run)
    assert body["resume_checkpoint"] is None and body["resume_checkpoint_version"] is None
    assert body["resume_learner_step"] == 1
    assert len(body["resume_adapter"]) == 2


def test_retention_keeps_the_latest_version_with_a_checkpoint(app, client) -> None:
    """Versions between checkpoints carry none: "the latest checkpoint" is the latest version
    with checkpoint files, kept however old until a newer checkpoint is published."""
    run = make_run(app, max_staleness=0)
    fencing = attach(client, run)["fencing"]
    for version in range(1, 6):
        published = upload_and_publish(client, run, fencing, version, checkpoint=version == 1)
        assert published.status_code == 200, published.text
    everything = {v: version_keys(app, run.id, v) for v in range(1, 6)}
    # The window is {4, 5}; 1 holds the latest checkpoint.
    assert set(retain(app, run.id)) == everything[2] | everything[3]
    assert deleted_versions(app, run.id) == [2, 3]
    assert all(app.state.store.head(k) is not None for k in everything[1])

    # A newer checkpoint arrives with version 6: version 1 (and 4, out of the window) go.
    assert upload_and_publish(client, run, fencing, 6).status_code == 200
    assert set(retain(app, run.id)) == everything[1] | everything[4]
    assert deleted_versions(app, run.id) == [1, 2, 3, 4]
