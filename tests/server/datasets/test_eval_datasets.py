"""An eval block on a stored dataset (uploaded or hf): the run is `preparing` until run_prep has
read at most eval.max_prompts mapped rows into its eval rows; errors name `eval.dataset.…`; the
learner's config carries references, never inline eval rows."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import select

from server.models import EvalRow
from tests.server.datasets.files import QUESTIONS, jsonl, upload
from tests.server.datasets.test_runs_on_datasets import BASE, MAPPING, _attach, _expected_mapped

TRAIN = {"kind": "generator", "generator": "arithmetic", "size": 4, "seed": 0}


def _eval_block(dataset: dict[str, Any], **over: Any) -> dict[str, Any]:
    return {"dataset": dataset, "accuracy_reward": "numeric_match", **over}


def _create(client: Any, admin: dict[str, str], eval_dataset: dict[str, Any], **over: Any) -> Any:
    body = {**BASE, "dataset": TRAIN, "eval": _eval_block(eval_dataset, **over)}
    return client.post("/api/v1/runs", json=body, headers=admin)


def _eval_rows(app: Any, run_id: str) -> list[tuple[Any, Any]]:
    """The run's eval rows, read in a short session of its own (SQLite's one write lock)."""
    with app.state.sessionmaker() as session:
        rows = session.execute(
            select(EvalRow.prompt, EvalRow.reference)
            .where(EvalRow.run_id == uuid.UUID(run_id))
            .order_by(EvalRow.row_index)
        ).all()
        session.rollback()
    return [(r.prompt, r.reference) for r in rows]


def test_uploaded_eval_dataset_is_read_into_eval_rows(ds_app, ds_client, admin, run_jobs):  # type: ignore[no-untyped-def]
    dataset_id = upload(ds_client, admin, jsonl(QUESTIONS), "test.jsonl").json()["id"]
    created = _create(
        ds_client, admin, {"kind": "uploaded", "id": dataset_id, **MAPPING}, max_prompts=3
    )
    assert created.status_code == 201, created.text
    run = created.json()
    run_id = run["run"]["id"]
    assert run["run"]["status"] == "preparing"
    assert _eval_rows(ds_app, run_id) == []
    run_jobs("datasets", "run_prep")
    status = ds_client.get(f"/api/v1/runs/{run_id}", headers=admin).json()
    assert status["status"] == "pending", status
    assert status["stats"]["prompt_rows"] == {"queued": 4}  # the generator's rows, made once
    assert _eval_rows(ds_app, run_id) == _expected_mapped(QUESTIONS)[:3]
    attached = _attach(ds_client, run_id, run["learner_token"])
    assert attached.status_code == 200, attached.text
    assert attached.json()["run_config"]["eval"]["dataset"]["kind"] == "uploaded"
    evals = ds_client.get(f"/api/v1/runs/{run_id}/evals", headers=admin).json()
    assert [(v["version"], v["n_prompts"], v["state"]) for v in evals["versions"]] == [
        (0, 3, "pending")
    ]


def test_hf_eval_dataset_beside_an_uploaded_training_dataset(
    ds_app, ds_client, admin, run_jobs, tmp_path
):  # type: ignore[no-untyped-def]
    (tmp_path / "test.jsonl").write_bytes(jsonl(QUESTIONS[::-1]))
    train_id = upload(ds_client, admin, jsonl(QUESTIONS), "train.jsonl").json()["id"]
    hf = {"kind": "hf", "path": "json", "data_files": str(tmp_path / "test.jsonl"), **MAPPING}
    body = {
        **BASE,
        "dataset": {"kind": "uploaded", "id": train_id, **MAPPING},
        "eval": _eval_block(hf),
    }
    created = ds_client.post("/api/v1/runs", json=body, headers=admin)
    assert created.status_code == 201, created.text
    run_id = created.json()["run"]["id"]
    run_jobs("datasets", "run_prep")
    status = ds_client.get(f"/api/v1/runs/{run_id}", headers=admin).json()
    assert status["status"] == "pending", status
    assert status["stats"]["prompt_rows"] == {"queued": len(QUESTIONS)}
    assert _eval_rows(ds_app, run_id) == _expected_mapped(QUESTIONS[::-1])


def test_eval_dataset_errors_name_the_eval_fields(ds_client, admin, monkeypatch):  # type: ignore[no-untyped-def]
    dataset_id = upload(ds_client, admin, jsonl(QUESTIONS), "test.jsonl").json()["id"]
    missing = _create(ds_client, admin, {"kind": "uploaded", "id": dataset_id})  # no `prompt`
    assert missing.status_code == 422
    detail = str(missing.json())
    assert "eval.dataset.prompt_column" in detail and "question" in detail, detail
    unknown = _create(
        ds_client, admin, {"kind": "uploaded", "id": "00000000-0000-4000-8000-000000000000"}
    )
    assert unknown.status_code == 422 and "eval.dataset.id" in str(unknown.json())
    monkeypatch.setattr("protocol.run_config.MAX_EVAL_PROMPTS", 2)
    too_many = _create(ds_client, admin, {"kind": "uploaded", "id": dataset_id, **MAPPING})
    assert too_many.status_code == 422 and "eval.max_prompts" in str(too_many.json())
    listed = ds_client.get("/api/v1/runs", headers=admin).json()
    assert listed == [] or all(r["name"] != BASE["name"] for r in listed)


@pytest.mark.parametrize("kind", ["jsonl", "generator"])
def test_learner_config_leaves_inline_eval_rows_out(ds_client, admin, kind):  # type: ignore[no-untyped-def]
    rows = [{"prompt": q["question"], "answer": q["answer"]} for q in QUESTIONS]
    dataset = (
        {"kind": "jsonl", "rows": rows}
        if kind == "jsonl"
        else {"kind": "generator", "size": 3, "seed": 1}
    )
    created = _create(ds_client, admin, dataset)
    assert created.status_code == 201, created.text
    run = created.json()
    assert run["run"]["status"] == "pending"
    attached = _attach(ds_client, run["run"]["id"], run["learner_token"])
    assert attached.status_code == 200, attached.text
    sent = attached.json()["run_config"]["eval"]["dataset"]
    if kind == "jsonl":
        assert sent == {"kind": "rows_omitted", "rows": len(rows)}
    else:
        assert sent == run["run"]["config"]["eval"]["dataset"]


def test_a_reward_reading_a_missing_column_is_refused_or_fails_the_run(
    ds_client, admin, run_jobs, tmp_path
):  # type: ignore[no-untyped-def]
    reward = [{"name": "math_verify", "kwargs": {"column": "solution"}}]
    dataset_id = upload(ds_client, admin, jsonl(QUESTIONS), "q.jsonl").json()["id"]
    uploaded = {"kind": "uploaded", "id": dataset_id, "prompt_column": "question"}
    body = {**BASE, "dataset": uploaded, "rewards": reward}
    refused = ds_client.post("/api/v1/runs", json=body, headers=admin)
    assert refused.status_code == 422
    error = refused.json()
    assert error["field"] == "rewards"
    assert "reads the reference column 'solution'" in error["detail"]
    assert "its reference columns: answer, source" in error["detail"]
    # an hf dataset's columns are learnt when it loads: the run fails with the same reason
    (tmp_path / "q.jsonl").write_bytes(jsonl(QUESTIONS))
    hf = {"kind": "hf", "path": "json", "data_files": str(tmp_path / "q.jsonl")}
    created = ds_client.post(
        "/api/v1/runs",
        json={**body, "dataset": {**hf, "prompt_column": "question"}},
        headers=admin,
    )
    assert created.status_code == 201, created.text
    run_id = created.json()["run"]["id"]
    run_jobs("datasets", "run_prep")
    run = ds_client.get(f"/api/v1/runs/{run_id}", headers=admin).json()
    assert run["status"] == "failed"
    assert "reads the reference column 'solution'" in run["status_reason"]
