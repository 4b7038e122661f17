"""The dashboard's Projects page and the runs list by project, through the real app on Postgres
and SQLite (docs/guides/dashboard.md): projects with their run counts, create and rename (a
refused name shows why, nothing changes), CSRF on both, the runs page's project select, and
the new-run form's project (its run's and its uploaded file's)."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from tests.conftest import mint_token
from tests.server.dashboard.test_pages import login
from tests.server.datasets.files import QUESTIONS, jsonl
from tests.server.runs.conftest import admin, example_config, runs_app, runs_client

__all__ = ["admin", "runs_app", "runs_client"]
pytestmark = pytest.mark.timeout(120)


def _project_rows(html: str) -> dict[str, str]:
    """Each project's row of the page, by name."""
    return {
        m.group(1): m.group(0)
        for m in re.finditer(r'<tr data-project="([^"]+)">.*?</tr>', html, re.S)
    }


def _run_count(row: str) -> int:
    match = re.search(r'<td class="num">(\d+)</td>', row)
    assert match, row
    return int(match.group(1))


def _listed_names(client: TestClient, admin: dict[str, str]) -> list[str]:
    return [p["name"] for p in client.get("/api/v1/projects", headers=admin).json()]


def test_projects_page_lists_creates_and_renames(
    runs_app, runs_client: TestClient, admin: dict[str, str]
) -> None:  # type: ignore[no-untyped-def]
    csrf = login(runs_client, mint_token(runs_app, "admin", name="dash"))
    runs_client.post("/api/v1/runs", json=example_config(name="r"), headers=admin)
    page = runs_client.get("/projects")
    assert page.status_code == 200 and 'href="/projects" aria-current="page"' in page.text
    assert _run_count(_project_rows(page.text)["default"]) == 1

    made = runs_client.post("/projects", data={"name": "team-a", "csrf_token": csrf})
    assert made.status_code == 200 and made.url.path == "/projects"  # after the redirect
    rows = _project_rows(made.text)
    assert set(rows) == {"default", "team-a"} and _run_count(rows["team-a"]) == 0

    taken = runs_client.post("/projects", data={"name": "team-a", "csrf_token": csrf})
    assert taken.status_code == 409 and "a project named &#39;team-a&#39; exists" in taken.text
    bad = runs_client.post("/projects", data={"name": "Team A", "csrf_token": csrf})
    assert bad.status_code == 422 and 'role="alert"' in bad.text and "lowercase slug" in bad.text
    assert _listed_names(runs_client, admin) == ["default", "team-a"]

    team = next(p for p in runs_client.get("/api/v1/projects", headers=admin).json()
                if p["name"] == "team-a")  # fmt: skip
    renamed = runs_client.post(
        f"/projects/{team['id']}/rename", data={"name": "team-b", "csrf_token": csrf}
    )
    assert renamed.status_code == 200 and "team-b" in _project_rows(renamed.text)
    onto = runs_client.post(
        f"/projects/{team['id']}/rename", data={"name": "default", "csrf_token": csrf}
    )
    assert onto.status_code == 409
    bad_rename = runs_client.post(
        f"/projects/{team['id']}/rename", data={"name": "-b", "csrf_token": csrf}
    )
    assert bad_rename.status_code == 422 and "lowercase slug" in bad_rename.text
    assert _listed_names(runs_client, admin) == ["default", "team-b"]


def test_project_forms_check_csrf_and_need_a_session(
    runs_app, runs_client: TestClient, admin: dict[str, str]
) -> None:  # type: ignore[no-untyped-def]
    outside = runs_client.get("/projects", follow_redirects=False)
    assert outside.status_code == 303 and outside.headers["location"] == "/login"
    login(runs_client, mint_token(runs_app, "admin", name="dash"))
    forged = runs_client.post("/projects", data={"name": "team-a", "csrf_token": "forged"})
    assert forged.status_code == 403
    assert _listed_names(runs_client, admin) == ["default"]


def test_the_runs_page_filters_by_project(
    runs_app, runs_client: TestClient, admin: dict[str, str]
) -> None:  # type: ignore[no-untyped-def]
    runs_client.post("/api/v1/projects", json={"name": "team-a"}, headers=admin)
    for name, project in (("in-a", "team-a"), ("in-default", "default")):
        made = runs_client.post(
            f"/api/v1/runs?project={project}", json=example_config(name=name), headers=admin
        )
        assert made.status_code == 201, made.text
    login(runs_client, mint_token(runs_app, "admin", name="dash"))
    every = runs_client.get("/runs").text
    assert ">in-a<" in every and ">in-default<" in every
    assert '<option value="team-a" >team-a (1 runs)</option>' in every
    of_a = runs_client.get("/runs?project=team-a").text
    assert ">in-a<" in of_a and ">in-default<" not in of_a
    assert '<option value="team-a" selected>' in of_a
    assert 'hx-get="/runs/table?project=team-a"' in of_a
    table = runs_client.get("/runs/table?project=team-a&status=pending").text
    assert ">in-a<" in table and ">in-default<" not in table
    none = runs_client.get("/runs/table?project=team-a&status=failed").text
    assert "No runs in state failed in project team-a" in none
    for unknown in ("nope", "a\x00b"):  # every project's runs
        shown = runs_client.get("/runs", params={"project": unknown})
        assert shown.status_code == 200 and ">in-default<" in shown.text


def test_the_new_run_form_makes_the_run_and_its_file_in_the_chosen_project(
    runs_app, runs_client: TestClient, admin: dict[str, str]
) -> None:  # type: ignore[no-untyped-def]
    runs_client.post("/api/v1/projects", json={"name": "team-a"}, headers=admin)
    csrf = login(runs_client, mint_token(runs_app, "admin", name="dash"))
    assert '<option value="team-a" >team-a</option>' in runs_client.get("/runs/new").text
    form = {
        "name": "form-run",
        "rewards": "numeric_match",
        "dataset.kind": "uploaded",
        "dataset.prompt_column": "question",
        "dataset.reference_columns": "answer",
        "csrf_token": csrf,
    }
    files = {"dataset.file": ("q.jsonl", jsonl(QUESTIONS), "application/json")}
    made = runs_client.post("/runs/new", data={**form, "project": "team-a"}, files=files)
    assert made.status_code == 200, made.text
    run = runs_client.get("/api/v1/runs", headers=admin).json()[0]
    dataset = runs_client.get("/api/v1/datasets", headers=admin).json()[0]
    assert run["project"] == "team-a" and dataset["project"] == "team-a"
    dash_token = runs_client.get("/api/v1/admin-tokens", headers=admin).json()
    assert run["created_by_token_id"] == next(t["id"] for t in dash_token if t["name"] == "dash")
    assert "<td>q.jsonl</td><td>team-a</td>" in runs_client.get("/runs/new").text

    unknown = runs_client.post("/runs/new", data={**form, "project": "nope"}, files=files)
    assert unknown.status_code == 422
    assert re.search(r'data-error-for="project">project nope not found', unknown.text)
    picked = {**form, "dataset.id": dataset["id"]}
    elsewhere = runs_client.post("/runs/new", data={**picked, "project": "default"})
    assert elsewhere.status_code == 422
    assert re.search(
        r'data-error-for="dataset.id">[^<]*in project &#39;team-a&#39;', elsewhere.text
    )
    assert len(runs_client.get("/api/v1/runs", headers=admin).json()) == 1
    assert len(runs_client.get("/api/v1/datasets", headers=admin).json()) == 1
