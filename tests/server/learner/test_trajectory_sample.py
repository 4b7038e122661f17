"""`GET /api/v1/runs/{id}/trajectories/sample`: one trajectory of a real format 2 batch in the
app's store, attached to a run as `complete` leaves it; and the learner's trajectory metrics
round-tripping through `POST/GET …/metrics`."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from learner.trajectory_metrics import trajectory_metrics
from protocol.batch_format import TrajectorySample
from protocol.batch_reader import TrajectoryRecord
from protocol.batches import write_batch, write_trajectory_batch
from server.db import transaction
from server.models import RolloutBatch
from tests.conftest import make_settings
from tests.harness.batches import accepted_batch
from tests.protocol import batch_factory as bf
from tests.protocol import trajectory_factory as tf
from tests.server.learner.support import attach, make_run, make_worker


@pytest.fixture
def settings(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    """Both databases (conftest's db_url)."""
    return make_settings(db_url, tmp_path / "bucket")


ENVIRONMENT = {
    "name": "tool_calls",
    "tools": ["calculator"],
    "max_turns": 3,
    "max_total_tokens": 1024,
}


def _batch_with(app: Any, run_id: uuid.UUID, path: Path) -> uuid.UUID:
    """An accepted batch of the run whose object in the store is the file at `path`."""
    worker_id, _ = make_worker(app)
    batch_id = accepted_batch(app, run_id, worker_id, version=0)
    with transaction(app.state.sessionmaker) as session:
        batch = session.execute(
            select(RolloutBatch).where(RolloutBatch.id == batch_id)
        ).scalar_one()
        app.state.store.put_bytes(batch.bucket_key, path.read_bytes())
        batch.bytes = path.stat().st_size
    return batch_id


def _v2_batch(
    app: Any, run_id: uuid.UUID, tmp_path: Path
) -> tuple[uuid.UUID, list[TrajectorySample]]:
    samples = tf.make_samples(seed=3)
    path = tmp_path / "v2.parquet"
    write_trajectory_batch(path, tf.make_meta(run_id=str(run_id)), samples)
    return _batch_with(app, run_id, path), sorted(
        samples, key=lambda s: (s.prompt_row_id, s.group_index)
    )


def _get(client: Any, run_id: uuid.UUID, headers: dict[str, str], **params: Any) -> Any:
    return client.get(f"/api/v1/runs/{run_id}/trajectories/sample", params=params, headers=headers)


def test_sample_returns_the_row_as_written(app, client, admin_headers, tmp_path) -> None:
    run = make_run(app, environment=ENVIRONMENT)
    batch_id, samples = _v2_batch(app, run.id, tmp_path)
    for row in (0, len(samples) - 1):
        response = _get(client, run.id, admin_headers, batch_id=str(batch_id), row=row)
        assert response.status_code == 200, response.text
        body = response.json()
        want = samples[row]
        t = want.trajectory
        assert (body["prompt_row_id"], body["group_index"]) == (
            want.prompt_row_id,
            want.group_index,
        )
        assert body["rows"] == len(samples) and body["row"] == row
        assert body["batch_state"] == "accepted" and body["adapter_version"] == 0
        assert body["stop_reason"] == t.stop_reason
        assert (body["tool_calls"], body["tool_errors"]) == (t.tool_calls, t.tool_errors)
        assert body["total_tokens"] == len(t.token_ids)
        assert body["trained_tokens"] == sum(t.loss_mask)
        assert [(s["kind"], s["start"], s["end"]) for s in body["spans"]] == [
            (s.kind, s.start, s.end) for s in t.spans
        ]
        assert [s["trained"] for s in body["spans"]] == [s.kind == "model" for s in t.spans]
        assert [(m["kind"], m["content"], m["trained"]) for m in body["messages"]] == [
            (m.kind, m.content, m.kind == "model") for m in t.messages
        ]
        assert [c for m in body["messages"] for c in m["tool_calls"]] == [
            c.model_dump() for m in t.messages for c in m.tool_calls
        ]
        assert body["info"] == t.info


def test_sample_defaults_to_the_latest_batch(app, client, admin_headers, tmp_path) -> None:
    run = make_run(app, environment=ENVIRONMENT)
    batch_id, samples = _v2_batch(app, run.id, tmp_path)
    body = _get(client, run.id, admin_headers).json()
    assert body["batch_id"] == str(batch_id) and body["prompt_row_id"] == samples[0].prompt_row_id


def test_sample_errors(app, client, admin_headers, tmp_path) -> None:
    run = make_run(app, environment=ENVIRONMENT)
    assert _get(client, run.id, admin_headers).status_code == 404  # no batch yet
    assert _get(client, uuid.uuid4(), admin_headers).status_code == 404
    batch_id, samples = _v2_batch(app, run.id, tmp_path)
    missing = _get(client, run.id, admin_headers, batch_id=str(uuid.uuid4()))
    assert missing.status_code == 404
    outside = _get(client, run.id, admin_headers, batch_id=str(batch_id), row=len(samples))
    assert outside.status_code == 422 and outside.json()["field"] == "row"
    negative = _get(client, run.id, admin_headers, batch_id=str(batch_id), row=-1)
    assert negative.status_code == 422
    assert _get(client, run.id, {}, batch_id=str(batch_id)).status_code == 401
    v1_path = tmp_path / "v1.parquet"
    write_batch(v1_path, bf.make_meta(run_id=str(run.id)), bf.make_samples())
    v1 = _batch_with(app, run.id, v1_path)
    refused = _get(client, run.id, admin_headers, batch_id=str(v1))
    assert refused.status_code == 422 and refused.json()["field"] == "batch_id"
    assert "format 2" in refused.json()["detail"]
    with transaction(app.state.sessionmaker) as session:
        key = session.execute(select(RolloutBatch.bucket_key).where(RolloutBatch.id == batch_id))
        app.state.store.delete(key.scalar_one())
    gone = _get(client, run.id, admin_headers, batch_id=str(batch_id))
    assert gone.status_code == 404 and "no longer in the store" in gone.json()["detail"]


def test_trajectory_metrics_round_trip(app, client, admin_headers) -> None:
    run = make_run(app, environment=ENVIRONMENT)
    fencing = attach(client, run)["fencing"]
    records = [
        TrajectoryRecord(
            prompt_row_id=s.prompt_row_id,
            group_index=s.group_index,
            token_ids=s.trajectory.token_ids,
            loss_mask=s.trajectory.loss_mask,
            logprobs=s.trajectory.logprobs,
            spans=list(s.trajectory.spans),
            messages=list(s.trajectory.messages),
            stop_reason=s.trajectory.stop_reason,
            tool_calls=s.trajectory.tool_calls,
            tool_errors=s.trajectory.tool_errors,
        )
        for s in tf.make_samples(seed=5)
    ]
    values = trajectory_metrics(records)
    assert values["trajectories"] == len(records)
    assert values["turns_mean"] == sum(r.model_turns for r in records) / len(records)
    assert values["tool_calls"] == sum(r.tool_calls for r in records)
    assert values["stop_done"] == len(records) and values["stop_length"] == 0
    posted = client.post(
        run.url("metrics"),
        json={"fencing": fencing, "points": [{"step": 1, "version": 1, "values": values}]},
        headers=run.headers,
    )
    assert posted.status_code == 200, posted.text
    (point,) = client.get(run.url("metrics"), headers=admin_headers).json()["learner"]
    assert point["values"] == values
