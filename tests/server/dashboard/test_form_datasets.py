"""The new-run form's stored datasets: a file uploaded with the form goes through the datasets
upload (same checks) and the run reads it as {kind: uploaded, id}; a stored dataset can be
picked; a file that cannot be a dataset, or a missing column, is an error next to its field."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from server.db import transaction
from server.models import Dataset, Run
from tests.conftest import make_settings
from tests.server.dashboard.test_pages import login
from tests.server.datasets.files import QUESTIONS, jsonl, parquet, upload


@pytest.fixture
def settings(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    return make_settings(db_url, tmp_path / "bucket")


FORM = {
    "name": "form-run",
    "rewards": "numeric_match",
    "dataset.kind": "uploaded",
    "dataset.prompt_column": "question",
    "dataset.reference_columns": "answer",
}


def _count(app, model) -> int:  # type: ignore[no-untyped-def]
    with transaction(app.state.sessionmaker) as session:
        return int(session.execute(select(func.count()).select_from(model)).scalar_one())


def test_a_file_uploaded_with_the_form_becomes_the_runs_dataset(
    client: TestClient, app, admin_token: str
) -> None:  # type: ignore[no-untyped-def]
    csrf = login(client, admin_token)
    files = {"dataset.file": ("q.parquet", parquet(QUESTIONS), "application/octet-stream")}
    r = client.post("/runs/new", data={**FORM, "csrf_token": csrf}, files=files)
    assert r.status_code == 200, r.text
    with transaction(app.state.sessionmaker) as session:
        run = session.execute(select(Run)).scalar_one()
        dataset = session.execute(select(Dataset)).scalar_one()
        assert run.status == "preparing" and run.dataset_id == dataset.id
        assert run.config["dataset"]["id"] == str(dataset.id)
        assert (dataset.format, dataset.row_count) == ("parquet", len(QUESTIONS))
    page = client.get("/runs/new")
    assert "q.parquet" in page.text and 'id="stored-datasets"' in page.text


def test_a_stored_dataset_is_picked(client: TestClient, app, admin_token: str) -> None:  # type: ignore[no-untyped-def]
    headers = {"Authorization": f"Bearer {admin_token}"}
    dataset_id = upload(client, headers, jsonl(QUESTIONS), "q.jsonl").json()["id"]
    csrf = login(client, admin_token)
    assert dataset_id in client.get("/runs/new").text
    r = client.post("/runs/new", data={**FORM, "dataset.id": dataset_id, "csrf_token": csrf})
    assert r.status_code == 200, r.text
    assert _count(app, Run) == 1 and _count(app, Dataset) == 1


def test_a_bad_file_or_column_is_an_error_next_to_its_field(
    client: TestClient, app, admin_token: str
) -> None:  # type: ignore[no-untyped-def]
    csrf = login(client, admin_token)
    bad = {"dataset.file": ("q.jsonl", b'{"question": "\xff"}\n', "application/json")}
    r = client.post("/runs/new", data={**FORM, "csrf_token": csrf}, files=bad)
    assert r.status_code == 422
    assert 'data-error-for="dataset.file">line 1: not UTF-8' in r.text
    assert _count(app, Dataset) == 0 and _count(app, Run) == 0

    good = {"dataset.file": ("q.jsonl", jsonl(QUESTIONS), "application/json")}
    r = client.post(
        "/runs/new",
        data={**FORM, "dataset.reference_columns": "answer, solution", "csrf_token": csrf},
        files=good,
    )
    assert r.status_code == 422  # an upload's columns are known at once, though it is pending
    assert "has no column &#39;solution&#39;; its columns: question, answer, source" in r.text
    assert _count(app, Dataset) == 1 and _count(app, Run) == 0
    r = client.post("/runs/new", data={**FORM, "csrf_token": csrf})
    assert r.status_code == 422
    assert 'data-error-for="dataset.id">choose a stored dataset' in r.text


@pytest.mark.parametrize("kind", ["jsonl", "uploaded"])
def test_a_jsonl_file_json_cannot_read_is_a_field_error(
    client: TestClient, app, admin_token: str, kind: str
) -> None:  # type: ignore[no-untyped-def]
    """An integer over Python's 4,300 digits (ValueError) or nesting past the parser's stack
    (RecursionError), inline or uploaded: an error next to the file field, not a 500."""
    csrf = login(client, admin_token)
    head = b'{"question": "q", "n": '
    for line in (head + b"9" * 5000 + b"}\n", head + b"[" * 100_000 + b"]" * 100_000 + b"}\n"):
        files = {"dataset.file": ("q.jsonl", line, "application/json")}
        r = client.post(
            "/runs/new", data={**FORM, "dataset.kind": kind, "csrf_token": csrf}, files=files
        )
        assert r.status_code == 422, r.text[-500:]
        assert 'data-error-for="dataset.file">line 1: ' in r.text
    assert _count(app, Dataset) == 0 and _count(app, Run) == 0
