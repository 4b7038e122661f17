"""A run from each dataset kind (uploaded JSONL and Parquet, hf from local data files and from a
local folder, generator, inline) reaches `running` and leases the right prompts: the texts come
from the file under the column mapping and system prompt, the reference columns never reach the
worker but are in the learner's claim, and attach carries no rows."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from protocol import datasets
from tests.server.datasets.files import QUESTIONS, jsonl, parquet, upload
from tests.server.learner.support import FP, make_worker
from tests.server.leases.helpers import batch_manifest, bearer

SYSTEM = "Solve the word problem. Answer with a number."
BASE: dict[str, Any] = {
    "name": "datasets-test",
    "base_model": "smollm2-135m-instruct",
    "rewards": [{"name": "numeric_match"}],
    "group_size": 2,
    "prompts_per_lease": 2,
    "prompts_per_step": 2,
    "max_staleness": 1,
}
MAPPING = {"prompt_column": "question", "system_prompt": SYSTEM, "reference_columns": ["answer"]}


def _expected_mapped(rows: list[dict[str, Any]]) -> list[tuple[Any, dict[str, Any]]]:
    return [
        (
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": r["question"]}],
            {"answer": r["answer"]},
        )
        for r in rows
    ]


def _create(client: Any, admin: dict[str, str], dataset: dict[str, Any], **over: Any) -> Any:
    return client.post("/api/v1/runs", json={**BASE, "dataset": dataset, **over}, headers=admin)


def _attach(client: Any, run_id: str, token: str) -> Any:
    return client.post(
        f"/api/v1/runs/{run_id}/learner/attach",
        json={"tokenizer_fingerprint": FP},
        headers=bearer(token),
    )


def _lease_and_claim(
    client: Any, app: Any, admin: dict[str, str], run_id: str, learner: str
) -> tuple[Any, Any, Any]:
    """Attach, acquire one lease as a worker, complete it, claim it: (the attach's run config,
    the lease, the claimed batch)."""
    attached = _attach(client, run_id, learner)
    assert attached.status_code == 200, attached.text
    fencing = attached.json()["fencing"]
    status = client.get(f"/api/v1/runs/{run_id}", headers=admin).json()["status"]
    assert status == "running"
    _, worker_token = make_worker(app)
    worker = bearer(worker_token)
    acquired = client.post("/api/v1/leases/acquire", json={}, headers=worker)
    assert acquired.status_code == 200, acquired.text
    lease = acquired.json()
    data = json.dumps(lease["prompts"]).encode()
    base = f"/api/v1/leases/{lease['lease_id']}"
    body = {
        "fencing": lease["fencing"],
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    put = client.post(f"{base}/upload", json=body, headers=worker).json()
    assert client.put(put["url"], content=data, headers=put["headers"]).status_code == 200
    manifest = batch_manifest(lease, data, key=put["key"])
    done = client.post(
        f"{base}/complete", json={"fencing": lease["fencing"], "manifest": manifest}, headers=worker
    )
    assert done.status_code == 200, done.text
    claimed = client.post(
        f"/api/v1/runs/{run_id}/batches/claim",
        json={"fencing": fencing, "max_groups": 10},
        headers=bearer(learner),
    )
    assert claimed.status_code == 200, claimed.text
    return attached.json()["run_config"], lease, claimed.json()["batches"][0]


def _check_prompts(lease: Any, batch: Any, expected: list[tuple[Any, dict[str, Any]]]) -> None:
    wanted = expected[: len(lease["prompts"])]
    assert [p["prompt"] for p in lease["prompts"]] == [w[0] for w in wanted]
    for prompt in lease["prompts"]:
        assert set(prompt) == {"prompt_row_id", "dataset_row_id", "prompt", "epoch"}
    assert [(p["prompt"], p["reference"]) for p in batch["prompts"]] == wanted


def _prepared(client: Any, admin: dict[str, str], run_jobs: Any, dataset: dict[str, Any]) -> Any:
    """Create a run on a stored dataset: preparing (attach refused) until the jobs ran."""
    created = _create(client, admin, dataset)
    assert created.status_code == 201, created.text
    run = created.json()
    assert run["run"]["status"] == "preparing"
    refused = _attach(client, run["run"]["id"], run["learner_token"])
    assert refused.status_code == 409
    assert "preparing its prompt rows" in refused.json()["detail"]
    run_jobs("datasets", "run_prep")
    status = client.get(f"/api/v1/runs/{run['run']['id']}", headers=admin).json()
    assert status["status"] == "pending", status
    assert status["stats"]["prompt_rows"] == {"queued": len(QUESTIONS)}
    return run


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_run_on_an_uploaded_dataset(ds_app, ds_client, admin, run_jobs, fmt):  # type: ignore[no-untyped-def]
    data = jsonl(QUESTIONS) if fmt == "jsonl" else parquet(QUESTIONS)
    dataset_id = upload(ds_client, admin, data, f"q.{fmt}").json()["id"]
    run = _prepared(ds_client, admin, run_jobs, {"kind": "uploaded", "id": dataset_id, **MAPPING})
    config, lease, batch = _lease_and_claim(
        ds_client, ds_app, admin, run["run"]["id"], run["learner_token"]
    )
    assert config["dataset"] == run["run"]["config"]["dataset"]  # a reference, no rows
    _check_prompts(lease, batch, _expected_mapped(QUESTIONS))


@pytest.mark.parametrize("layout", ["data_files", "folder"])
def test_run_on_an_hf_dataset_from_local_files(
    ds_app, ds_client, admin, run_jobs, tmp_path, layout
):  # type: ignore[no-untyped-def]
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "train.jsonl").write_bytes(jsonl(QUESTIONS))
    spec: dict[str, Any] = (
        {"kind": "hf", "path": "json", "data_files": str(folder / "train.jsonl")}
        if layout == "data_files"
        else {"kind": "hf", "path": str(folder)}
    )
    run = _prepared(ds_client, admin, run_jobs, {**spec, **MAPPING})
    listed = ds_client.get("/api/v1/datasets", headers=admin).json()
    assert len(listed) == 1 and listed[0]["kind"] == "hf" and listed[0]["status"] == "ready"
    assert listed[0]["row_count"] == len(QUESTIONS) and listed[0]["fingerprint"]
    assert set(listed[0]["columns"]) == {"question", "answer", "source"}
    config, lease, batch = _lease_and_claim(
        ds_client, ds_app, admin, run["run"]["id"], run["learner_token"]
    )
    assert config["dataset"] == run["run"]["config"]["dataset"]  # a reference, no rows
    _check_prompts(lease, batch, _expected_mapped(QUESTIONS))
    # a second run on the same spec reuses the loaded dataset
    again = _create(ds_client, admin, {**spec, **MAPPING})
    assert again.status_code == 201
    assert len(ds_client.get("/api/v1/datasets", headers=admin).json()) == 1


def test_run_on_the_generator_and_inline_kinds(ds_app, ds_client, admin):  # type: ignore[no-untyped-def]
    rows = [{"prompt": q["question"], "answer": q["answer"]} for q in QUESTIONS]
    generated = datasets.generate("arithmetic", 4, 7)
    for dataset, expected in (
        ({"kind": "jsonl", "rows": rows}, rows),
        ({"kind": "generator", "size": 4, "seed": 7}, generated),
    ):
        created = _create(ds_client, admin, dataset)
        assert created.status_code == 201, created.text
        run = created.json()
        assert run["run"]["status"] == "pending"
        config, lease, batch = _lease_and_claim(
            ds_client, ds_app, admin, run["run"]["id"], run["learner_token"]
        )
        if dataset["kind"] == "jsonl":
            assert config["dataset"] == {"kind": "rows_omitted", "rows": len(rows)}
        else:
            assert config["dataset"] == run["run"]["config"]["dataset"]
        pairs = [(r["prompt"], {"answer": r["answer"]}) for r in expected]
        _check_prompts(lease, batch, pairs)
        ds_client.post(f"/api/v1/runs/{run['run']['id']}/cancel", headers=admin)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_chat_messages_prompt_column_is_leased_as_it_is(ds_app, ds_client, admin, run_jobs, fmt):  # type: ignore[no-untyped-def]
    rows = [
        {"messages": [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": q["question"]}], "answer": q["answer"]}
        for q in QUESTIONS
    ]  # fmt: skip
    data = jsonl(rows) if fmt == "jsonl" else parquet(rows)  # Parquet: list<struct<role, content>>
    dataset_id = upload(ds_client, admin, data, f"chat.{fmt}").json()["id"]
    # system_prompt goes before string prompts only: chat prompts keep their own messages
    spec = {"kind": "uploaded", "id": dataset_id, "prompt_column": "messages",
            "system_prompt": SYSTEM, "reference_columns": ["answer"]}  # fmt: skip
    run = _prepared(ds_client, admin, run_jobs, spec)
    _, lease, batch = _lease_and_claim(
        ds_client, ds_app, admin, run["run"]["id"], run["learner_token"]
    )
    _check_prompts(lease, batch, [(r["messages"], {"answer": r["answer"]}) for r in rows])
