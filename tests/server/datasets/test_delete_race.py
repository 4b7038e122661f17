"""DELETE /api/v1/datasets/{id} racing a run creation on that dataset (on Postgres; SQLite has
one writer at a time): whichever commits first wins and the other is refused with a 4xx, never
a 500 from the runs → datasets foreign key."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from protocol.run_config import RunConfig
from server.datasets import repository as datasets_repo
from server.runs import service as runs
from tests.harness.runs import run_config
from tests.server.datasets.files import QUESTIONS, jsonl, upload

pytestmark = pytest.mark.timeout(60)


def _config(dataset_id: str) -> dict[str, Any]:
    return run_config(
        name="race",
        dataset={"kind": "uploaded", "id": dataset_id, "prompt_column": "question"},
        group_size=8,
        prompts_per_step=8,
    )


def _in_thread(work: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = work()
        except Exception as exc:  # reported by the test
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def _ready(ds_client: Any, admin: dict[str, str], run_jobs: Any) -> str:
    dataset_id = str(upload(ds_client, admin, jsonl(QUESTIONS), "q.jsonl").json()["id"])
    run_jobs("datasets")
    return dataset_id


def test_a_delete_while_a_run_is_created_on_the_dataset_is_409(ds_app, ds_client, admin, run_jobs):  # type: ignore[no-untyped-def]
    dataset_id = _ready(ds_client, admin, run_jobs)
    creating = ds_app.state.sessionmaker()
    run, _ = runs.create_run(creating, RunConfig.model_validate(_config(dataset_id)))
    url = f"/api/v1/datasets/{dataset_id}"
    thread, out = _in_thread(lambda: ds_client.delete(url, headers=admin))
    time.sleep(1.0)  # the delete is past its "no run uses it" check, waiting on the row
    creating.commit()
    creating.close()
    thread.join(30)
    assert "error" not in out, out
    assert out["result"].status_code == 409, out["result"].text
    assert ds_client.get(url, headers=admin).status_code == 200
    assert ds_client.get(f"/api/v1/runs/{run.id}", headers=admin).status_code == 200


def test_a_run_created_while_its_dataset_is_deleted_is_422(ds_app, ds_client, admin, run_jobs):  # type: ignore[no-untyped-def]
    dataset_id = _ready(ds_client, admin, run_jobs)
    deleting = ds_app.state.sessionmaker()
    datasets_repo.remove(deleting, uuid.UUID(dataset_id))  # not committed yet
    config = _config(dataset_id)
    thread, out = _in_thread(lambda: ds_client.post("/api/v1/runs", json=config, headers=admin))
    time.sleep(1.0)  # the creation has read the dataset, or waits on it
    deleting.commit()
    deleting.close()
    thread.join(30)
    assert "error" not in out, out
    assert out["result"].status_code == 422, out["result"].text
    assert out["result"].json()["field"] == "dataset.id"
    assert "not found" in out["result"].json()["detail"]
