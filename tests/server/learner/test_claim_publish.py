"""Claims and publishes: exactly once into a version (invariant 7), strictly +1 versions
(invariant 8), staleness window at claim (invariant 5), nothing lost (invariant 12)."""

from __future__ import annotations

from sqlalchemy import select

from server.db import transaction
from server.models import AdapterVersion, PromptRow
from tests.harness.batches import accepted_batch
from tests.server.learner.support import (
    attach,
    batch_states,
    claim,
    expire_learner,
    make_run,
    make_worker,
    publish_body,
    row_states,
    run_row,
    upload,
    upload_and_publish,
)


def test_claim_hands_out_prompts_with_reference_columns(app, client) -> None:
    run = make_run(app)
    fencing = attach(client, run)["fencing"]
    worker_id, _ = make_worker(app)
    batch = accepted_batch(app, run.id, worker_id, version=0)
    body = claim(client, run, fencing).json()
    (claimed,) = body["batches"]
    assert claimed["batch_id"] == str(batch) and claimed["worker_id"] == str(worker_id)
    assert claimed["staleness"] == 0 and claimed["n_samples"] == 4 and claimed["n_groups"] == 2
    prompts = {p["prompt"]: p["reference"] for p in claimed["prompts"]}
    assert prompts == {"What is 0 + 1?": {"answer": "1"}, "What is 1 + 1?": {"answer": "2"}}
    downloaded = client.get(claimed["url"])
    assert downloaded.status_code == 200
    import hashlib

    assert hashlib.sha256(downloaded.content).hexdigest() == claimed["sha256"]
    assert body["exhausted"] is False  # two rows are still queued
    assert batch_states(app, run.id) == {batch: "claimed"}
    assert {s for s, _, _ in row_states(app, run.id).values()} == {"claimed", "queued"}
    # Nothing else to hand out: an empty answer, not the same batch again.
    again = claim(client, run, fencing).json()
    assert again["batches"] == [] and again["exhausted"] is False


def test_claim_oldest_version_first_up_to_max_groups(app, client) -> None:
    rows = [{"prompt": f"p{i}", "answer": "1"} for i in range(6)]
    run = make_run(app, dataset={"kind": "jsonl", "rows": rows})
    fencing = attach(client, run)["fencing"]
    assert upload_and_publish(client, run, fencing, 1).status_code == 200
    worker_id, _ = make_worker(app)
    newer = accepted_batch(app, run.id, worker_id, version=1)
    older = accepted_batch(app, run.id, worker_id, version=0)
    newest = accepted_batch(app, run.id, worker_id, version=1)
    first = claim(client, run, fencing, max_groups=4).json()
    assert [b["batch_id"] for b in first["batches"]] == [str(older), str(newer)]
    assert [b["staleness"] for b in first["batches"]] == [1, 0]
    second = claim(client, run, fencing, max_groups=4).json()
    assert [b["batch_id"] for b in second["batches"]] == [str(newest)]
    assert second["exhausted"] is True


def test_learner_dies_after_claim_batches_return_then_consumed_once(app, client) -> None:
    run = make_run(app)
    first = attach(client, run)["fencing"]
    worker_id, _ = make_worker(app)
    batches = [accepted_batch(app, run.id, worker_id, version=0) for _ in range(2)]
    held = [b["batch_id"] for b in claim(client, run, first).json()["batches"]]
    assert sorted(held) == sorted(str(b) for b in batches)
    expire_learner(app, run.id)  # the learner dies without publishing

    second = attach(client, run)["fencing"]
    assert set(batch_states(app, run.id).values()) == {"accepted"}
    again = claim(client, run, second).json()
    assert sorted(b["batch_id"] for b in again["batches"]) == sorted(held)
    assert again["exhausted"] is True

    published = upload_and_publish(client, run, second, 1, batches, final=True)
    assert published.status_code == 200, published.text
    assert published.json()["consumed_batches"] == 2
    assert set(batch_states(app, run.id).values()) == {"consumed"}
    states = row_states(app, run.id)
    assert {s for s, _, _ in states.values()} == {"consumed"}
    with transaction(app.state.sessionmaker) as session:
        versions = set(session.execute(select(PromptRow.consumed_version)).scalars())
    assert versions == {1}
    assert run_row(app, run.id).groups_in_flight == 0


def test_consumed_batches_are_never_handed_out_again(app, client) -> None:
    run = make_run(app)
    fencing = attach(client, run)["fencing"]
    worker_id, _ = make_worker(app)
    batch = accepted_batch(app, run.id, worker_id, version=0)
    claim(client, run, fencing)
    assert upload_and_publish(client, run, fencing, 1, [batch]).status_code == 200
    assert batch_states(app, run.id) == {batch: "consumed"}
    # Publishing the same batch again into the next version is refused.
    again = upload_and_publish(client, run, fencing, 2, [batch])
    assert again.status_code == 409
    assert run_row(app, run.id).current_version == 1
    later = accepted_batch(app, run.id, worker_id, version=1)
    body = claim(client, run, fencing).json()
    assert [b["batch_id"] for b in body["batches"]] == [str(later)]


def test_versions_are_strictly_plus_one(app, client) -> None:
    run = make_run(app)
    fencing = attach(client, run)["fencing"]
    skip = upload(client, run, fencing, 2)
    assert skip.status_code == 409
    response = client.post(
        run.url("adapters"), json=publish_body(run, fencing, 2), headers=run.headers
    )
    assert response.status_code == 409
    assert response.json() | {"detail": ""} == {
        "detail": "",
        "code": "version_not_next",
        "current_version": 0,
        "run_status": "running",
        "version_sha256": None,  # version 2 is not published
    }
    assert run_row(app, run.id).current_version == 0
    assert upload_and_publish(client, run, fencing, 1).status_code == 200
    replay = client.post(
        run.url("adapters"), json=publish_body(run, fencing, 1), headers=run.headers
    )
    # a replay (an answer lost) is told the sha256 of the version that landed
    assert replay.status_code == 409
    with transaction(app.state.sessionmaker) as session:
        landed = session.execute(select(AdapterVersion.sha256)).scalar_one()
    assert replay.json()["version_sha256"] == landed
    assert (replay.json()["current_version"], replay.json()["code"]) == (1, "version_not_next")
    assert upload_and_publish(client, run, fencing, 2).status_code == 200
    with transaction(app.state.sessionmaker) as session:
        got = list(session.execute(select(AdapterVersion.version)).scalars())
    assert sorted(got) == [1, 2]


def test_publish_requires_uploaded_objects_with_stated_size(app, client) -> None:
    run = make_run(app)
    fencing = attach(client, run)["fencing"]
    missing = client.post(
        run.url("adapters"), json=publish_body(run, fencing, 1), headers=run.headers
    )
    assert missing.status_code == 409 and "not in the store" in missing.json()["detail"]
    assert upload(client, run, fencing, 1).status_code == 200
    body = publish_body(run, fencing, 1)
    body["files"][0]["size"] += 1
    wrong = client.post(run.url("adapters"), json=body, headers=run.headers)
    assert wrong.status_code == 409 and "bytes" in wrong.json()["detail"]
    body = publish_body(run, fencing, 1)
    body["files"][0]["key"] = f"runs/{run.id}/adapters/v000009/adapter_config.json"
    elsewhere = client.post(run.url("adapters"), json=body, headers=run.headers)
    assert elsewhere.status_code == 422
    assert run_row(app, run.id).current_version == 0


def test_uploads_are_conditional_and_names_validated(app, client) -> None:
    run = make_run(app)
    fencing = attach(client, run)["fencing"]
    for name in ("../x", "a/b", "..", ""):
        bad = client.post(
            run.url("uploads"),
            json={
                "fencing": fencing,
                "version": 1,
                "files": [{"name": name, "size": 1, "sha256": "0" * 64, "kind": "adapter"}],
            },
            headers=run.headers,
        )
        assert bad.status_code == 422, name
    response = upload(client, run, fencing, 1)
    ups = response.json()["uploads"]
    assert all(u["headers"].get("If-None-Match") == "*" for u in ups)
    assert {u["key"] for u in ups} == {
        f"runs/{run.id}/adapters/v000001/adapter_config.json",
        f"runs/{run.id}/adapters/v000001/adapter_model.safetensors",
        f"runs/{run.id}/checkpoints/v000001/trainer_state.json",
    }
    # The same URL cannot overwrite what it wrote.
    first = ups[0]
    size = int(first["headers"]["Content-Length"])
    data = app.state.store.get_bytes(first["key"])
    assert len(data) == size
    overwrite = client.put(first["url"], content=data, headers=first["headers"])
    assert overwrite.status_code == 412


def test_max_versions_completes_run_and_final_is_served(app, client, admin_headers) -> None:
    run = make_run(app, max_versions=2)
    fencing = attach(client, run)["fencing"]
    worker_id, _ = make_worker(app)
    batch = accepted_batch(app, run.id, worker_id, version=0)
    claim(client, run, fencing)
    one = upload_and_publish(client, run, fencing, 1, [batch])
    assert one.json()["run_status"] == "running"
    accepted_batch(app, run.id, worker_id, version=1)
    two = upload_and_publish(client, run, fencing, 2)
    assert two.status_code == 200 and two.json()["run_status"] == "completed"
    row = run_row(app, run.id)
    assert (row.status, row.current_version, row.groups_in_flight) == ("completed", 2, 0)
    with transaction(app.state.sessionmaker) as session:
        final = session.execute(
            select(AdapterVersion).where(AdapterVersion.final.is_(True))
        ).scalar_one()
        assert final.version == 2
    assert upload(client, run, fencing, 3).status_code == 409
    three = client.post(
        run.url("adapters"), json=publish_body(run, fencing, 3), headers=run.headers
    )
    assert three.status_code == 409
    ledger = client.get(run.url("ledger"), headers=admin_headers).json()
    assert ledger["balanced"] is True
    assert ledger["by_state"] == {"consumed": 2, "dropped": 2}
    assert ledger["dropped_by_reason"] == {"run_completed": 2}
    served = client.get(run.url("adapters/final"), headers=admin_headers)
    assert served.status_code == 200, served.text
    assert served.json()["version"] == 2 and served.json()["final"] is True


def test_attach_claim_publish_on_both_databases(db_url, tmp_path) -> None:
    """The same flow on SQLite (the embedded single-writer path) and Postgres."""
    from fastapi.testclient import TestClient

    from server.app import create_app
    from tests.conftest import make_settings

    application = create_app(make_settings(db_url, tmp_path / "bucket"), migrate=True)
    try:
        with TestClient(application) as test_client:
            run = make_run(application)
            fencing = attach(test_client, run)["fencing"]
            worker_id, _ = make_worker(application)
            batch = accepted_batch(application, run.id, worker_id, version=0)
            body = claim(test_client, run, fencing).json()
            assert [b["batch_id"] for b in body["batches"]] == [str(batch)]
            published = upload_and_publish(test_client, run, fencing, 1, [batch])
            assert published.status_code == 200, published.text
            assert batch_states(application, run.id) == {batch: "consumed"}
            assert run_row(application, run.id).current_version == 1
    finally:
        application.state.engine.dispose()
