"""The typed client's learner calls against the real app (Postgres, local store)."""

from __future__ import annotations

import hashlib

import pytest

from protocol import schemas_learner as sl
from protocol.client import AsyncGrpoClient, ConflictError, ForbiddenError
from tests.harness.batches import accepted_batch
from tests.server.learner.support import FP, make_run, make_worker


def test_learner_round_trip_through_the_client(app, client) -> None:
    run = make_run(app)
    worker_id, worker_token = make_worker(app)
    batch = accepted_batch(app, run.id, worker_id, version=0)
    api = AsyncGrpoClient("http://testserver", run.token, http=client)
    rid = str(run.id)

    attached = api.learner_attach(rid, FP)
    with pytest.raises(ConflictError):
        api.learner_attach(rid, FP)
    fencing = attached.fencing
    assert api.learner_heartbeat(rid, fencing).status == "running"
    claimed = api.claim_batches(rid, fencing, max_groups=4)
    assert [(b.batch_id, b.target_version) for b in claimed.batches] == [(batch, 1)]
    assert claimed.batches[0].prompts[0].reference == {"answer": "1"}

    files = {"adapter_config.json": b"{}", "adapter_model.safetensors": b"w" * 32}
    ckpt = {"trainer_state.json": b'{"step": 1}'}

    def entries(table: dict[str, bytes], kind: str) -> list[sl.UploadFile]:
        return [
            sl.UploadFile(name=n, size=len(d), sha256=hashlib.sha256(d).hexdigest(), kind=kind)
            for n, d in table.items()
        ]

    ups = api.request_uploads(
        rid,
        sl.UploadsRequest(
            fencing=fencing,
            version=1,
            files=entries(files, "adapter") + entries(ckpt, "checkpoint"),  # type: ignore[arg-type]
        ),
    )
    data = files | ckpt
    published_files: dict[str, list[sl.PublishedFile]] = {"adapter": [], "checkpoint": []}
    for up in ups.uploads:
        assert client.put(up.url, content=data[up.name], headers=up.headers).status_code < 300
        published_files[up.kind].append(
            sl.PublishedFile(
                name=up.name,
                key=up.key,
                sha256=hashlib.sha256(data[up.name]).hexdigest(),
                size=len(data[up.name]),
            )
        )
    result = api.publish_adapter(
        rid,
        sl.PublishRequest(
            fencing=fencing,
            version=1,
            files=published_files["adapter"],
            checkpoint_files=published_files["checkpoint"],
            learner_step=1,
            consumed_batch_ids=[batch],
        ),
    )
    assert (result.version, result.consumed_batches) == (1, 1)
    # The claim names the version it trains into: one a publish has reached is a 409 naming
    # the current version; a later one is claimed for.
    later = accepted_batch(app, run.id, worker_id, version=1)
    with pytest.raises(ConflictError) as behind:
        api.claim_batches(rid, fencing, max_groups=4, target_version=1)
    assert behind.value.body["current_version"] == 1
    ahead = api.claim_batches(rid, fencing, max_groups=4, target_version=3)
    assert [(b.batch_id, b.target_version, b.staleness) for b in ahead.batches] == [(later, 3, 1)]
    stored = api.post_learner_metrics(
        rid, fencing, [sl.MetricPointIn(step=1, version=1, values={"loss": 0.1})]
    )
    assert stored.stored == 1
    check = api.spot_check(
        rid,
        sl.SpotCheckRequest(
            fencing=fencing,
            worker_id=worker_id,
            batch_id=batch,
            mean_abs_logprob_diff=0.001,
            n_tokens=10,
        ),
    )
    assert check.worker_status == "active" and check.spot_checks == 1
    with pytest.raises(ConflictError):
        api.learner_heartbeat(rid, fencing + 100)
    as_worker = AsyncGrpoClient("http://testserver", worker_token, http=client)
    with pytest.raises(ForbiddenError):
        as_worker.learner_heartbeat(rid, fencing)
