"""Learner attach, heartbeat and takeover (invariant 2), and the learner's authorization."""

from __future__ import annotations

import uuid

from sqlalchemy import func, select

from server.db import transaction
from server.models import AdapterVersion
from tests.harness.batches import accepted_batch
from tests.server.learner.support import (
    FP,
    attach,
    batch_states,
    claim,
    expire_learner,
    make_run,
    make_worker,
    publish_body,
    run_row,
    upload,
    upload_and_publish,
)


def test_attach_moves_pending_to_running_and_stores_fingerprint(app, client) -> None:
    run = make_run(app)
    assert run_row(app, run.id).status == "pending"
    body = attach(client, run)
    row = run_row(app, run.id)
    assert row.status == "running"
    assert row.tokenizer_fingerprint == FP
    assert row.learner_fencing == body["fencing"] == row.fencing_seq
    assert body["current_version"] == 0
    assert body["resume_checkpoint"] is None and body["resume_adapter"] is None
    assert body["resume_checkpoint_version"] is None and body["resume_learner_step"] is None
    assert body["run_config"]["max_staleness"] == 1
    assert 0 < body["heartbeat_interval_s"] < body["lease_ttl_s"]


def test_second_learner_refused_while_live_then_takes_over(app, client) -> None:
    run = make_run(app)
    first = attach(client, run)["fencing"]
    refused = client.post(
        run.url("learner/attach"), json={"tokenizer_fingerprint": FP}, headers=run.headers
    )
    assert refused.status_code == 409
    assert run_row(app, run.id).learner_fencing == first
    hb = client.post(run.url("learner/heartbeat"), json={"fencing": first}, headers=run.headers)
    assert hb.status_code == 200 and hb.json()["status"] == "running"

    # The first learner claims a batch and uploads version 1, then stops heartbeating.
    worker_id, _ = make_worker(app)
    batch = accepted_batch(app, run.id, worker_id, version=0)
    assert [b["batch_id"] for b in claim(client, run, first).json()["batches"]] == [str(batch)]
    assert upload(client, run, first, 1).status_code == 200
    expire_learner(app, run.id)

    late = client.post(run.url("learner/heartbeat"), json={"fencing": first}, headers=run.headers)
    assert late.status_code == 409
    second = attach(client, run)["fencing"]
    assert second > first

    # The old learner's publish after the takeover: 409, nothing changed.
    before = run_row(app, run.id)
    old = client.post(
        run.url("adapters"), json=publish_body(run, first, 1, [batch]), headers=run.headers
    )
    assert old.status_code == 409
    after = run_row(app, run.id)
    assert (after.current_version, after.learner_fencing) == (0, second)
    assert after.learner_expires_at == before.learner_expires_at
    assert batch_states(app, run.id) == {batch: "accepted"}
    with transaction(app.state.sessionmaker) as session:
        assert session.execute(select(func.count()).select_from(AdapterVersion)).scalar() == 0
    # Every fenced call of the old token is refused the same way.
    for path, body in [
        ("batches/claim", {"fencing": first, "max_groups": 2}),
        ("metrics", {"fencing": first, "points": [{"step": 1, "values": {"loss": 1.0}}]}),
        (
            "uploads",
            {
                "fencing": first,
                "version": 1,
                "files": [{"name": "a.json", "size": 1, "sha256": "0" * 64, "kind": "adapter"}],
            },
        ),
    ]:
        assert client.post(run.url(path), json=body, headers=run.headers).status_code == 409

    # The new learner re-uploads the same keys (the late objects are replaced) and publishes.
    claimed = claim(client, run, second).json()["batches"]
    assert [b["batch_id"] for b in claimed] == [str(batch)]
    ok = upload_and_publish(client, run, second, 1, [batch])
    assert ok.status_code == 200, ok.text
    assert run_row(app, run.id).current_version == 1


def test_reattach_returns_resume_checkpoint(app, client) -> None:
    run = make_run(app)
    fencing = attach(client, run)["fencing"]
    assert upload_and_publish(client, run, fencing, 1).status_code == 200
    expire_learner(app, run.id)
    body = attach(client, run)
    assert body["current_version"] == 1
    names = {f["name"]: f for f in body["resume_checkpoint"]}
    assert set(names) == {"trainer_state.json"}
    assert names["trainer_state.json"]["key"].endswith("/checkpoints/v000001/trainer_state.json")
    fetched = client.get(names["trainer_state.json"]["url"])
    assert fetched.status_code == 200 and b'"step": 1' in fetched.content
    assert {f["name"] for f in body["resume_adapter"]} == {
        "adapter_config.json",
        "adapter_model.safetensors",
    }
    assert (body["resume_checkpoint_version"], body["resume_learner_step"]) == (1, 1)


def test_fingerprint_must_match_once_set(app, client) -> None:
    run = make_run(app)
    attach(client, run)
    expire_learner(app, run.id)
    other = client.post(
        run.url("learner/attach"), json={"tokenizer_fingerprint": "other"}, headers=run.headers
    )
    assert other.status_code == 409
    assert "fingerprint" in other.json()["detail"]
    attach(client, run)


def test_heartbeat_with_wrong_token_changes_nothing(app, client) -> None:
    run = make_run(app)
    fencing = attach(client, run)["fencing"]
    before = run_row(app, run.id)
    bad = client.post(
        run.url("learner/heartbeat"), json={"fencing": fencing + 1}, headers=run.headers
    )
    assert bad.status_code == 409
    assert run_row(app, run.id).learner_expires_at == before.learner_expires_at
    good = client.post(run.url("learner/heartbeat"), json={"fencing": fencing}, headers=run.headers)
    assert good.status_code == 200
    assert run_row(app, run.id).learner_expires_at > before.learner_expires_at


def test_worker_token_on_learner_calls_is_forbidden(app, client, admin_headers) -> None:
    run = make_run(app)
    fencing = attach(client, run)["fencing"]
    _, worker_token = make_worker(app)
    headers = {"Authorization": f"Bearer {worker_token}"}
    calls = [
        ("learner/attach", {"tokenizer_fingerprint": FP}),
        ("learner/heartbeat", {"fencing": fencing}),
        ("batches/claim", {"fencing": fencing, "max_groups": 2}),
        (f"batches/{uuid.uuid4()}/reject", {"fencing": fencing, "reason": "invalid"}),
        ("uploads", {"fencing": fencing, "version": 1, "files": []}),
        ("adapters", publish_body(run, fencing, 1)),
        ("metrics", {"fencing": fencing, "points": [{"step": 0, "values": {}}]}),
        (
            "spot-checks",
            {
                "fencing": fencing,
                "worker_id": str(uuid.uuid4()),
                "batch_id": str(uuid.uuid4()),
                "mean_abs_logprob_diff": 0.0,
                "n_tokens": 1,
            },
        ),
    ]
    for path, body in calls:
        response = client.post(run.url(path), json=body, headers=headers)
        assert response.status_code == 403, (path, response.text)
    # Admin reads refuse the learner and the worker.
    for headers_ in (run.headers, headers):
        assert client.get(run.url("ledger"), headers=headers_).status_code == 403
        assert client.get(run.url("metrics"), headers=headers_).status_code == 403
    assert client.get(run.url("ledger"), headers=admin_headers).status_code == 200


def test_learner_token_of_another_run_and_unknown_fields(app, client) -> None:
    run = make_run(app)
    other = make_run(app)
    wrong = client.post(
        other.url("learner/attach"), json={"tokenizer_fingerprint": FP}, headers=run.headers
    )
    assert wrong.status_code == 404
    assert run_row(app, other.id).status == "pending"
    extra = client.post(
        run.url("learner/attach"),
        json={"tokenizer_fingerprint": FP, "surprise": 1},
        headers=run.headers,
    )
    assert extra.status_code == 422
    assert any(e["field"] == "surprise" for e in extra.json()["errors"])


def test_a_learner_of_another_model_is_refused_at_attach(app, client) -> None:
    run = make_run(app)
    response = client.post(
        run.url("learner/attach"),
        json={"tokenizer_fingerprint": FP, "model": "Qwen/Qwen2.5-1.5B-Instruct"},
        headers=run.headers,
    )
    assert response.status_code == 409
    body = response.json()
    assert body["detail"] == (
        "the run trains 'smollm2-135m-instruct' but this learner loaded "
        "'Qwen/Qwen2.5-1.5B-Instruct' (--model)"
    )
    row = run_row(app, run.id)
    assert row.status == "pending" and row.learner_fencing is None  # nothing was taken
    same = client.post(
        run.url("learner/attach"),
        json={"tokenizer_fingerprint": FP, "model": "smollm2-135m-instruct"},
        headers=run.headers,
    )
    assert same.status_code == 200, same.text
