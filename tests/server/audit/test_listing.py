"""GET /api/v1/audit (filters, cursor paging), GET /api/v1/audit.csv, the retention job and
the dashboard's Audit page, on Postgres and SQLite (docs/guides/audit.md)."""

from __future__ import annotations

import csv
import io
import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from server.db import transaction
from server.db_types import db_now_plus
from server.jobs.runner import JobContext, run_job
from server.models import AuditEntry
from tests.conftest import mint_token
from tests.server.audit.conftest import bearer, entries
from tests.server.dashboard.test_pages import login

pytestmark = pytest.mark.timeout(120)

URL = "/api/v1/audit"


def _projects(client: TestClient, admin: dict[str, str], n: int) -> list[str]:
    ids = []
    for i in range(n):
        made = client.post("/api/v1/projects", json={"name": f"p{i}"}, headers=admin)
        assert made.status_code == 201, made.text
        ids.append(made.json()["id"])
    return ids


def _all_pages(client: TestClient, admin: dict[str, str], **params: Any) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    cursor = None
    for _ in range(50):
        query = {**params, **({"cursor": cursor} if cursor else {})}
        page = client.get(URL, params=query, headers=admin)
        assert page.status_code == 200, page.text
        seen += page.json()["entries"]
        cursor = page.json()["next_cursor"]
        if cursor is None:
            return seen
    raise AssertionError("the pages did not end")


def test_pages_follow_the_cursor_newest_first(
    runs_client: TestClient, runs_app: Any, admin: dict[str, str]
) -> None:
    _projects(runs_client, admin, 5)
    whole = runs_client.get(URL, headers=admin).json()
    assert whole["next_cursor"] is None and len(whole["entries"]) == 5
    paged = _all_pages(runs_client, admin, limit=2)
    assert [e["id"] for e in paged] == [e["id"] for e in whole["entries"]]
    written = [e.id for e in entries(runs_app)]
    assert [e["id"] for e in paged] == written[::-1]  # newest first, none twice or lost
    # a page whose last entry is the oldest says so: no empty page after it
    assert runs_client.get(URL, params={"limit": 5}, headers=admin).json()["next_cursor"] is None


def test_filters(runs_client: TestClient, runs_app: Any, admin: dict[str, str]) -> None:
    first, second = _projects(runs_client, admin, 2)
    renamed = runs_client.patch(f"/api/v1/projects/{first}", json={"name": "z"}, headers=admin)
    assert renamed.status_code == 200
    assert runs_client.get("/api/v1/runs").status_code == 401
    other = bearer(mint_token(runs_app, "admin", name="other"))
    _projects(runs_client, other, 0)
    assert (
        runs_client.post("/api/v1/projects", json={"name": "o"}, headers=other).status_code == 201
    )

    def ids(**params: Any) -> list[str]:
        return [e["action"] for e in _all_pages(runs_client, admin, **params)]

    assert ids(action="project.rename") == ["project.rename"]
    assert ids(project_id=first) == ["project.rename", "project.create"]
    assert ids(object_type="project", object_id=second) == ["project.create"]
    assert ids(outcome="unauthorized") == ["GET /api/v1/runs"]
    other_id = entries(runs_app, token_name="other")[0].token_id
    assert ids(token_id=str(other_id)) == ["project.create"]
    rows = entries(runs_app)
    assert len(ids(since=rows[0].at.isoformat())) == len(rows)
    assert ids(until=rows[0].at.isoformat()) == []


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"limit": 0}, "limit"),
        ({"cursor": "x"}, "cursor"),
        ({"outcome": "maybe"}, "outcome"),
        ({"project_id": "nope"}, "project_id"),
        ({"since": "yesterday"}, "since"),
        ({"until": "9999-12-31T23:59:59-14:00"}, "until"),  # past year 9999 in UTC
        ({"since": "0001-01-01T00:00:00+14:00"}, "since"),
        ({"action": "a" * 65}, "action"),
    ],
)
def test_bad_filters_are_422_naming_the_field(
    runs_client: TestClient, admin: dict[str, str], params: dict[str, Any], field: str
) -> None:
    answer = runs_client.get(URL, params=params, headers=admin)
    assert answer.status_code == 422 and answer.json()["code"] == "validation_failed"
    assert any(e["field"].endswith(field) for e in answer.json()["errors"]), answer.json()


def test_only_admins_read_the_log(runs_client: TestClient, runs_app: Any) -> None:
    worker = bearer(mint_token(runs_app, "worker", name="w", scope_id=uuid.uuid4()))
    assert runs_client.get(URL, headers=worker).status_code == 403
    assert runs_client.get(f"{URL}.csv").status_code == 401


def test_csv_export_has_every_matching_entry(
    runs_client: TestClient, runs_app: Any, admin: dict[str, str]
) -> None:
    _projects(runs_client, admin, 3)
    answer = runs_client.get(f"{URL}.csv", params={"action": "project.create"}, headers=admin)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(answer.text)))
    listed = runs_client.get(URL, params={"action": "project.create"}, headers=admin).json()
    assert [r["id"] for r in rows] == [str(e["id"]) for e in listed["entries"]]
    assert {r["role"] for r in rows} == {"admin"} and rows[0]["token_name"] == "t"


def test_retention_deletes_only_old_entries(
    runs_client: TestClient, runs_app: Any, admin: dict[str, str]
) -> None:
    old, recent = _projects(runs_client, admin, 2)
    with transaction(runs_app.state.sessionmaker) as session:
        days = runs_app.state.settings.audit.retention_days
        session.execute(
            update(AuditEntry)
            .where(AuditEntry.object_id == old)
            .values(at=db_now_plus(-days * 86_400 - 60))
        )
    context = JobContext(
        settings=runs_app.state.settings,
        factory=runs_app.state.sessionmaker,
        store_factory=lambda: runs_app.state.store,
    )
    assert run_job("audit", context) == 1
    assert [e.object_id for e in entries(runs_app)] == [recent]
    assert run_job("audit", context) == 0


def test_the_dashboard_page_lists_filters_and_exports(
    runs_client: TestClient, runs_app: Any, admin: dict[str, str]
) -> None:
    first, _second = _projects(runs_client, admin, 2)
    csrf = login(runs_client, mint_token(runs_app, "admin", name="browser"))
    page = runs_client.get("/audit")
    assert page.status_code == 200
    assert page.text.count("data-audit-entry=") == 3  # two projects and this login
    assert 'data-action="dashboard.login"' in page.text
    one = runs_client.get("/audit/table", params={"object_id": first, "project_id": ""})
    assert one.text.count("data-audit-entry=") == 1 and "project.create" in one.text
    assert f'href="/audit.csv?object_id={first}"' in one.text  # the export of these filters
    wrong = {"project_id": "nope", "since": "then", "until": "9999-12-31T23:59:59-14:00"}
    bad = runs_client.get("/audit/table", params=wrong)
    assert bad.status_code == 200 and bad.text.count('role="alert"') == 3
    exported = runs_client.get("/audit.csv", params={"action": "project.create"})
    assert len(list(csv.DictReader(io.StringIO(exported.text)))) == 2
    assert runs_client.post("/logout", data={"csrf_token": csrf}).status_code == 200
    actions = [e.action for e in entries(runs_app, token_name="browser")]
    assert actions == ["dashboard.login", "dashboard.logout"]
    assert runs_client.get("/audit", follow_redirects=False).status_code == 303
