"""Stored datasets on the production bucket kind, S3 (moto's server): an upload is streamed to
S3 with its sha256, the jobs make it ready and a run on it prepared; a hostile upload leaves no
object; an hf dataset is written to S3 as Parquet."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.server.datasets.files import QUESTIONS, jsonl, parquet, upload

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def s3_app(pg_url: str, tmp_path: Path, moto_endpoint, s3_bucket):  # type: ignore[no-untyped-def]
    from server.app import create_app
    from server.config import S3Settings
    from tests.conftest import make_settings

    settings = make_settings(pg_url, tmp_path / "unused").model_copy(
        update={
            "bucket_url": f"s3://{s3_bucket}/pre",
            "s3": S3Settings(
                endpoint_url=moto_endpoint.url,
                path_style=True,
                access_key_id=moto_endpoint.access_key_id,
                secret_access_key=moto_endpoint.secret_access_key,
            ),
        }
    )
    app = create_app(settings, migrate=True)
    yield app
    app.state.engine.dispose()


@pytest.fixture
def s3_client(s3_app) -> Iterator[TestClient]:  # type: ignore[no-untyped-def]
    with TestClient(s3_app) as client:
        yield client


def _admin(app: Any) -> dict[str, str]:
    from tests.conftest import mint_token

    return {"Authorization": f"Bearer {mint_token(app, 'admin', name='t')}"}


def _run_jobs(app: Any, *jobs: str) -> list[Any]:
    from server.jobs.runner import JobContext, run_job

    ctx = JobContext(
        settings=app.state.settings,
        factory=app.state.sessionmaker,
        store_factory=lambda: app.state.store,
    )
    return [run_job(job, ctx) for job in jobs]


def _objects(endpoint: Any, bucket: str) -> list[str]:
    listed = endpoint.client().list_objects_v2(Bucket=bucket, Prefix="pre/datasets/")
    return sorted(o["Key"] for o in listed.get("Contents", []))


def test_uploads_to_s3_become_ready_and_a_run_prepares(
    s3_app, s3_client, moto_endpoint, s3_bucket, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    admin = _admin(s3_app)
    bad = upload(s3_client, admin, b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n', "bad.jsonl")
    assert bad.status_code == 422 and "line 2: not UTF-8" in bad.json()["detail"]
    assert _objects(moto_endpoint, s3_bucket) == []  # nothing half-created

    ids = {}
    for fmt, data in (("jsonl", jsonl(QUESTIONS)), ("parquet", parquet(QUESTIONS))):
        created = upload(s3_client, admin, data, f"q.{fmt}")
        assert created.status_code == 202, created.text
        ids[fmt] = created.json()["id"]
        key = f"pre/datasets/{ids[fmt]}/data.{fmt}"
        body = moto_endpoint.client().get_object(Bucket=s3_bucket, Key=key)["Body"].read()
        assert body == data
    assert _run_jobs(s3_app, "datasets") == [2]
    for fmt, dataset_id in ids.items():
        one = s3_client.get(f"/api/v1/datasets/{dataset_id}", headers=admin).json()
        assert (one["status"], one["row_count"]) == ("ready", len(QUESTIONS)), (fmt, one)

    (tmp_path / "train.jsonl").write_bytes(jsonl(QUESTIONS))
    hf = {"kind": "hf", "path": "json", "data_files": str(tmp_path / "train.jsonl")}
    for dataset in ({"kind": "uploaded", "id": ids["parquet"]}, hf):
        config = {
            "name": "s3-datasets",
            "base_model": "smollm2-135m-instruct",
            "dataset": {**dataset, "prompt_column": "question"},
            "rewards": [{"name": "numeric_match"}],
        }
        made = s3_client.post("/api/v1/runs", json=config, headers=admin)
        assert made.status_code == 201, made.text
        _run_jobs(s3_app, "datasets", "run_prep")
        run = s3_client.get(f"/api/v1/runs/{made.json()['run']['id']}", headers=admin).json()
        assert run["status"] == "pending", run
        assert run["stats"]["prompt_rows"] == {"queued": len(QUESTIONS)}
    hf_row = [
        d for d in s3_client.get("/api/v1/datasets", headers=admin).json() if d["kind"] == "hf"
    ]
    assert len(hf_row) == 1 and hf_row[0]["status"] == "ready"
    assert f"pre/datasets/{hf_row[0]['id']}/data.parquet" in _objects(moto_endpoint, s3_bucket)
