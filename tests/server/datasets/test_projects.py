"""Datasets in a project on Postgres and SQLite (docs/guides/projects.md): an upload names its
project (name or id; `default` without one; an unknown one is refused before anything is
kept), listings show and filter by it, a run reads only its own project's datasets, and an hf
spec is loaded once per project."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from server.models import Dataset
from server.models.project import DEFAULT_PROJECT_ID
from tests.server.datasets.files import QUESTIONS, jsonl, upload
from tests.server.datasets.test_runs_on_datasets import BASE, MAPPING

pytestmark = pytest.mark.timeout(120)


def _project(client: TestClient, admin: dict[str, str], name: str) -> dict[str, Any]:
    made = client.post("/api/v1/projects", json={"name": name}, headers=admin)
    assert made.status_code == 201, made.text
    return dict(made.json())


def _uploaded(client: TestClient, admin: dict[str, str], **params: Any) -> dict[str, Any]:
    answer = upload(client, admin, jsonl(QUESTIONS), "q.jsonl", **params)
    assert answer.status_code == 202, answer.text
    return dict(answer.json())


def _run(
    client: TestClient, admin: dict[str, str], project: str, dataset: dict[str, Any], **config: Any
) -> Any:
    mapped = {**dataset, **MAPPING} if dataset["kind"] != "generator" else dataset
    body = {**BASE, "dataset": mapped, **config}
    return client.post(f"/api/v1/runs?project={project}", json=body, headers=admin)


def test_an_upload_is_in_the_project_it_names_and_listed_by_it(
    ds_client: TestClient, admin: dict[str, str]
) -> None:
    team = _project(ds_client, admin, "team-a")
    plain = _uploaded(ds_client, admin)
    by_name = _uploaded(ds_client, admin, project="team-a")
    by_id = _uploaded(ds_client, admin, project=team["id"])
    assert (plain["project"], plain["project_id"]) == ("default", str(DEFAULT_PROJECT_ID))
    for made in (by_name, by_id):
        assert (made["project"], made["project_id"]) == ("team-a", team["id"])
    of_team = ds_client.get("/api/v1/datasets?project=team-a", headers=admin).json()
    assert sorted(d["id"] for d in of_team) == sorted([by_name["id"], by_id["id"]])
    of_default = ds_client.get("/api/v1/datasets?project=default", headers=admin).json()
    assert [d["id"] for d in of_default] == [plain["id"]]
    every = ds_client.get("/api/v1/datasets", headers=admin).json()
    assert len(every) == 3
    one = ds_client.get(f"/api/v1/datasets/{by_id['id']}", headers=admin).json()
    assert one["project"] == "team-a"


def test_an_unknown_project_is_422_and_keeps_nothing(
    ds_client: TestClient, admin: dict[str, str], db: Session, tmp_path: Path
) -> None:
    refused = upload(ds_client, admin, jsonl(QUESTIONS), "q.jsonl", project="nope")
    assert refused.status_code == 422, refused.text
    assert refused.json()["code"] == "unknown_project" and refused.json()["field"] == "project"
    assert db.execute(select(func.count()).select_from(Dataset)).scalar_one() == 0
    db.rollback()  # SQLite: the open read would hold the next request's write lock
    assert not any(p.is_file() for p in (tmp_path / "bucket").rglob("data.*"))
    for project in ("nope", "a\x00b"):  # no name holds NUL, which Postgres text cannot
        listed = ds_client.get("/api/v1/datasets", params={"project": project}, headers=admin)
        assert listed.status_code == 422 and listed.json()["code"] == "unknown_project"


def test_a_run_reads_only_its_own_projects_datasets(
    ds_client: TestClient, admin: dict[str, str]
) -> None:
    _project(ds_client, admin, "team-a")
    _project(ds_client, admin, "team-b")
    of_a = _uploaded(ds_client, admin, project="team-a")
    mine = _run(ds_client, admin, "team-a", dataset={"kind": "uploaded", "id": of_a["id"]})
    assert mine.status_code == 201, mine.text
    assert mine.json()["run"]["project"] == "team-a"

    theirs = _run(ds_client, admin, "team-b", dataset={"kind": "uploaded", "id": of_a["id"]})
    assert theirs.status_code == 422, theirs.text
    assert theirs.json()["code"] == "dataset_of_another_project"
    assert theirs.json()["field"] == "dataset.id" and "team-a" in theirs.json()["detail"]
    held_out = {
        "dataset": {"kind": "uploaded", "id": of_a["id"], **MAPPING},
        "every_versions": 1,
        "accuracy_reward": "numeric_match",
    }
    as_eval = _run(
        ds_client,
        admin,
        "default",
        dataset={"kind": "generator", "generator": "arithmetic", "size": 8},
        eval=held_out,
    )
    assert as_eval.status_code == 422, as_eval.text
    assert as_eval.json()["code"] == "dataset_of_another_project"
    assert as_eval.json()["field"] == "eval.dataset.id"
    base = {**BASE, "dataset": {"kind": "uploaded", "id": of_a["id"], **MAPPING}}
    sweep = {"name": "s", "base": base, "grid": {"seed": [1, 2]}, "project": "team-b"}
    swept = ds_client.post("/api/v1/sweeps", json=sweep, headers=admin)
    assert swept.status_code == 422, swept.text
    assert swept.json()["code"] == "dataset_of_another_project"
    assert swept.json()["field"] == "dataset.id" and "combination 0" in swept.json()["detail"]
    names = [r["name"] for r in ds_client.get("/api/v1/runs", headers=admin).json()]
    assert names == [BASE["name"]]  # only the run of team-a was made
    assert ds_client.get("/api/v1/sweeps", headers=admin).json() == []


def test_an_hf_spec_is_loaded_once_per_project(
    ds_client: TestClient, admin: dict[str, str], tmp_path: Path
) -> None:
    _project(ds_client, admin, "team-a")
    data = tmp_path / "train.jsonl"
    data.write_bytes(jsonl(QUESTIONS))
    spec = {"kind": "hf", "path": "json", "data_files": str(data)}
    for project, name in (("default", "d1"), ("default", "d2"), ("team-a", "a1")):
        made = _run(ds_client, admin, project, name=name, dataset=spec)
        assert made.status_code == 201, made.text
    rows = ds_client.get("/api/v1/datasets", headers=admin).json()
    assert sorted(d["project"] for d in rows) == ["default", "team-a"]
    assert {d["kind"] for d in rows} == {"hf"}
