"""Run creation on a stored dataset refuses what it can know (unknown or failed dataset, a
missing column named with the columns that exist, too many prompt rows) with 422 and nothing
created; run_prep fails a run whose rows cannot be used, redoes a preparation that died
half-way, and an hf dataset that cannot be reached fails with the reason. DELETE refuses a
dataset that a run uses."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import func, select

from server.models import DatasetRow, PromptRow, Run
from tests.server.datasets.files import QUESTIONS, jsonl, upload

BASE: dict[str, Any] = {
    "name": "prep-test",
    "base_model": "smollm2-135m-instruct",
    "rewards": [{"name": "numeric_match"}],
    "group_size": 2,
    "prompts_per_lease": 2,
    "prompts_per_step": 2,
}


def _create(client: Any, admin: dict[str, str], dataset: dict[str, Any], **over: Any) -> Any:
    return client.post("/api/v1/runs", json={**BASE, "dataset": dataset, **over}, headers=admin)


def _ready(client: Any, admin: dict[str, str], run_jobs: Any, rows: list[Any]) -> str:
    dataset_id = str(upload(client, admin, jsonl(rows), "q.jsonl").json()["id"])
    run_jobs("datasets")
    return dataset_id


def _no_run(db) -> None:  # type: ignore[no-untyped-def]
    db.rollback()
    assert db.execute(select(func.count()).select_from(Run)).scalar_one() == 0


def test_refusals_at_run_creation_name_the_field(ds_client, admin, db, run_jobs) -> None:  # type: ignore[no-untyped-def]
    missing = uuid.uuid4()
    resp = _create(ds_client, admin, {"kind": "uploaded", "id": str(missing)})
    assert resp.status_code == 422
    assert resp.json()["field"] == "dataset.id" and str(missing) in resp.json()["detail"]

    dataset_id = _ready(ds_client, admin, run_jobs, QUESTIONS)
    resp = _create(ds_client, admin, {"kind": "uploaded", "id": dataset_id})  # prompt column
    assert resp.status_code == 422
    assert resp.json()["field"] == "dataset.prompt_column"
    assert resp.json()["detail"].endswith(
        "has no column 'prompt'; its columns: question, answer, source"
    )

    spec = {"kind": "uploaded", "id": dataset_id, "prompt_column": "question",
            "reference_columns": ["answer", "solution"]}  # fmt: skip
    resp = _create(ds_client, admin, spec)
    assert resp.status_code == 422
    assert resp.json()["field"] == "dataset.reference_columns"
    assert "no column 'solution'" in resp.json()["detail"]

    spec = {"kind": "uploaded", "id": dataset_id, "prompt_column": "question"}
    resp = _create(ds_client, admin, spec, epochs=1_000_000)
    assert resp.status_code == 422
    assert resp.json()["field"] == "epochs" and "5,000,000" in resp.json()["detail"]
    _no_run(db)


def test_a_failed_dataset_is_refused_with_its_reason(
    ds_app, ds_client, admin, db, run_jobs
) -> None:  # type: ignore[no-untyped-def]
    from tests.server.datasets.files import parquet

    bad = upload(ds_client, admin, parquet([{"prompt": "a"}]), "gone.parquet").json()["id"]
    ds_app.state.store.delete(f"datasets/{bad}/data.parquet")  # the job fails the dataset
    run_jobs("datasets")
    resp = _create(ds_client, admin, {"kind": "uploaded", "id": bad})
    assert resp.status_code == 422
    assert "failed: the uploaded file is missing from the bucket" in resp.json()["detail"]
    _no_run(db)


def test_inline_rows_are_bounded() -> None:
    from pydantic import ValidationError

    from protocol.run_config import RunConfig

    rows = [{"prompt": f"p{i}"} for i in range(1001)]
    with pytest.raises(ValidationError, match="use an uploaded dataset"):
        RunConfig.model_validate({**BASE, "dataset": {"kind": "jsonl", "rows": rows}})


def test_a_row_that_is_no_prompt_fails_the_run(ds_client, admin, db, run_jobs) -> None:  # type: ignore[no-untyped-def]
    rows = [{"question": "fine", "answer": "1"}, {"question": 7, "answer": "2"}]
    dataset_id = _ready(ds_client, admin, run_jobs, rows)
    spec = {"kind": "uploaded", "id": dataset_id, "prompt_column": "question"}
    run = _create(ds_client, admin, spec).json()["run"]
    run_jobs("run_prep")
    after = ds_client.get(f"/api/v1/runs/{run['id']}", headers=admin).json()
    assert after["status"] == "failed"
    assert after["status_reason"].startswith("row 1: column 'question': prompt must be")
    db.rollback()
    assert db.execute(select(func.count()).select_from(DatasetRow)).scalar_one() == 0


def test_a_preparation_that_died_half_way_is_redone(ds_app, ds_client, admin, db, run_jobs) -> None:  # type: ignore[no-untyped-def]
    dataset_id = _ready(ds_client, admin, run_jobs, QUESTIONS)
    spec = {"kind": "uploaded", "id": dataset_id, "prompt_column": "question"}
    run = _create(ds_client, admin, spec, epochs=2).json()["run"]
    run_id = uuid.UUID(run["id"])
    # what a crash after the first chunks leaves: some dataset rows, the run still preparing
    db.add_all(
        DatasetRow(run_id=run_id, row_index=i, prompt="partial", reference={}) for i in range(3)
    )
    db.commit()
    run_jobs("run_prep")
    after = ds_client.get(f"/api/v1/runs/{run['id']}", headers=admin).json()
    assert after["status"] == "pending"
    assert after["stats"]["prompt_rows"] == {"queued": 2 * len(QUESTIONS)}
    prompts = db.execute(
        select(DatasetRow.prompt).where(DatasetRow.run_id == run_id).order_by(DatasetRow.row_index)
    ).scalars()
    assert list(prompts) == [q["question"] for q in QUESTIONS]
    positions = db.execute(
        select(PromptRow.queue_pos).where(PromptRow.run_id == run_id).order_by(PromptRow.queue_pos)
    ).scalars()
    assert list(positions) == list(range(2 * len(QUESTIONS)))
    db.commit()  # SQLite: release the read transaction before the job writes
    assert run_jobs("run_prep") == [0]  # nothing left to prepare


def test_cancel_works_while_preparing(ds_client, admin, run_jobs) -> None:  # type: ignore[no-untyped-def]
    dataset_id = upload(ds_client, admin, jsonl(QUESTIONS), "q.jsonl").json()["id"]
    spec = {"kind": "uploaded", "id": dataset_id, "prompt_column": "question"}
    run = _create(ds_client, admin, spec).json()["run"]  # dataset still pending: run waits
    assert run_jobs("run_prep") == [0]
    assert ds_client.get(f"/api/v1/runs/{run['id']}", headers=admin).json()["status"] == "preparing"
    cancelled = ds_client.post(f"/api/v1/runs/{run['id']}/cancel", headers=admin)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    run_jobs("datasets", "run_prep")
    assert ds_client.get(f"/api/v1/runs/{run['id']}", headers=admin).json()["status"] == "cancelled"


def test_an_unreachable_hub_dataset_fails_the_run_with_the_reason(
    ds_client, admin, run_jobs, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    import datasets as hf
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hf.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    spec = {"kind": "hf", "path": "openai/gsm8k", "name": "main", "prompt_column": "question"}
    run = _create(ds_client, admin, spec).json()["run"]
    run_jobs("datasets", "run_prep")
    datasets = ds_client.get("/api/v1/datasets", headers=admin).json()
    assert datasets[0]["status"] == "failed" and "openai/gsm8k" in datasets[0]["reason"]
    after = ds_client.get(f"/api/v1/runs/{run['id']}", headers=admin).json()
    assert after["status"] == "failed"
    assert after["status_reason"].startswith(f"dataset {datasets[0]['id']} failed:")


def test_delete_refuses_a_dataset_in_use(ds_app, ds_client, admin, run_jobs) -> None:  # type: ignore[no-untyped-def]
    used = _ready(ds_client, admin, run_jobs, QUESTIONS)
    free = _ready(ds_client, admin, run_jobs, QUESTIONS)
    spec = {"kind": "uploaded", "id": used, "prompt_column": "question"}
    run = _create(ds_client, admin, spec).json()["run"]
    refused = ds_client.delete(f"/api/v1/datasets/{used}", headers=admin)
    assert refused.status_code == 409 and run["id"] in refused.json()["detail"]
    assert ds_client.delete(f"/api/v1/datasets/{free}", headers=admin).status_code == 204
    assert ds_app.state.store.head(f"datasets/{free}/data.jsonl") is None
    assert ds_client.get(f"/api/v1/datasets/{free}", headers=admin).status_code == 404


def test_an_hf_dataset_without_rows_fails_the_run_with_the_reason(
    ds_client, admin, run_jobs, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "empty.jsonl").write_bytes(b"")
    spec = {"kind": "hf", "path": "json", "data_files": str(tmp_path / "empty.jsonl")}
    run = _create(ds_client, admin, {**spec, "prompt_column": "question"}).json()["run"]
    run_jobs("datasets", "run_prep")
    (dataset,) = ds_client.get("/api/v1/datasets", headers=admin).json()
    assert dataset["status"] == "failed"
    assert dataset["reason"] == "the dataset holds no rows (a dataset needs at least one)"
    after = ds_client.get(f"/api/v1/runs/{run['id']}", headers=admin).json()
    assert after["status"] == "failed" and "holds no rows" in after["status_reason"]
