"""Project tokens and their roles on Postgres and SQLite (invariant 29; server/tokens/access.py,
server/tokens/roles.py): a token acts in its own project only — another project's run, sweep,
dataset or project is a 404, as if it did not exist — and only as its role allows (403
role_forbidden), in that order, before any input is read; nothing changes on a refusal."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from server.models import Dataset, Project, Run, Sweep, Token
from server.models.project import DEFAULT_PROJECT_ID
from tests.server.runs.conftest import example_config
from tests.server.sweeps.conftest import sweep_body

pytestmark = pytest.mark.timeout(120)

Headers = dict[str, str]
JSONL = b'{"prompt": "What is 1 + 1?", "answer": "2"}\n'


def _run(client: TestClient, headers: Headers, name: str = "r", **query: str) -> Any:
    return client.post(
        "/api/v1/runs", params=query, json=example_config(name=name), headers=headers
    )


def _made_run(client: TestClient, headers: Headers, name: str = "r") -> dict[str, Any]:
    made = _run(client, headers, name)
    assert made.status_code == 201, made.text
    return dict(made.json()["run"])


def _counts(db: Session) -> dict[str, int]:
    """Rows of everything a refused call could have made or changed."""
    db.rollback()
    counts = {
        m.__tablename__: db.scalar(select(func.count()).select_from(m))
        for m in (Run, Sweep, Dataset, Token, Project)
    }
    counts["revoked"] = db.scalar(select(func.count()).where(Token.revoked_at.is_not(None)))
    counts["paused"] = db.scalar(select(func.count()).where(Run.status != "pending"))
    db.rollback()
    return {k: int(v or 0) for k, v in counts.items()}


@pytest.fixture
def two_projects(
    runs_client: TestClient,
    admin: Headers,
    new_project: Callable[[str], str],
    project_token: Callable[[str, str], Headers],
) -> dict[str, Any]:
    """Projects a and b, a run and a sweep in each (a's by its member), a's tokens by role."""
    a, b = new_project("team-a"), new_project("team-b")
    tokens = {role: project_token(a, role) for role in ("owner", "member", "ci", "viewer")}
    b_owner = project_token(b, "owner")
    return {
        "a": a,
        "b": b,
        "tokens": tokens,
        "b_owner": b_owner,
        "a_run": _made_run(runs_client, tokens["member"], "a-run"),
        "b_run": _made_run(runs_client, b_owner, "b-run"),
        "b_sweep": runs_client.post("/api/v1/sweeps", json=sweep_body(), headers=b_owner).json(),
    }


def test_a_project_token_creates_in_its_own_project_and_records_itself(
    runs_client: TestClient, two_projects: dict[str, Any], db: Session
) -> None:
    ci = two_projects["tokens"]["ci"]
    run = _made_run(runs_client, ci, "ci-run")
    assert run["project_id"] == two_projects["a"] and run["project"] == "team-a"
    db.rollback()
    ci_id = db.scalar(select(Token.id).where(Token.kind == "project", Token.role == "ci"))
    db.rollback()  # on SQLite an open transaction would hold off the next request's writes
    assert run["created_by_token_id"] == str(ci_id)
    sweep = runs_client.post("/api/v1/sweeps", json=sweep_body(), headers=ci)
    assert sweep.status_code == 201, sweep.text
    assert sweep.json()["sweep"]["project_id"] == two_projects["a"]
    assert sweep.json()["sweep"]["created_by_token_id"] == str(ci_id)
    uploaded = runs_client.post("/api/v1/datasets?name=d.jsonl", content=JSONL, headers=ci)
    assert uploaded.status_code == 202, uploaded.text
    db.rollback()
    dataset = db.get(Dataset, uuid.UUID(uploaded.json()["id"]))
    assert dataset is not None and str(dataset.project_id) == two_projects["a"]


def test_listings_show_only_the_tokens_project(
    runs_client: TestClient, admin: Headers, two_projects: dict[str, Any]
) -> None:
    viewer = two_projects["tokens"]["viewer"]
    names = [r["name"] for r in runs_client.get("/api/v1/runs", headers=viewer).json()]
    assert names == ["a-run"]
    assert runs_client.get("/api/v1/sweeps", headers=viewer).json() == []
    projects = runs_client.get("/api/v1/projects", headers=viewer).json()
    assert [p["name"] for p in projects] == ["team-a"]
    everything = {r["name"] for r in runs_client.get("/api/v1/runs", headers=admin).json()}
    assert {"a-run", "b-run"} <= everything  # and b's sweep's runs


def test_naming_a_project_out_of_reach_is_as_unknown_as_none(
    runs_client: TestClient, two_projects: dict[str, Any], db: Session
) -> None:
    before = _counts(db)
    owner = two_projects["tokens"]["owner"]
    for project in ("team-b", "default", "no-such-project"):  # one fixture: its cost is the file's
        for answer in (
            _run(runs_client, owner, project=project),
            runs_client.get("/api/v1/runs", params={"project": project}, headers=owner),
            runs_client.post("/api/v1/sweeps", json=sweep_body(project=project), headers=owner),
        ):
            assert answer.status_code == 422, (project, answer.text)
            assert answer.json()["code"] == "unknown_project"
            assert answer.json()["field"] == "project"
    assert _counts(db) == before


def test_another_projects_objects_are_404_before_any_role_check(
    runs_client: TestClient, two_projects: dict[str, Any], db: Session
) -> None:
    run, sweep = two_projects["b_run"]["id"], two_projects["b_sweep"]["sweep"]["id"]
    b = two_projects["b"]
    before = _counts(db)
    expected = {
        ("GET", f"/api/v1/runs/{run}"): "run_not_found",
        ("POST", f"/api/v1/runs/{run}/pause"): "run_not_found",
        ("POST", f"/api/v1/runs/{run}/cancel"): "run_not_found",
        ("GET", f"/api/v1/runs/{run}/metrics"): "run_not_found",
        ("GET", f"/api/v1/runs/{run}/adapters"): "run_not_found",
        ("GET", f"/api/v1/runs/{run}/ledger"): "run_not_found",
        ("GET", f"/api/v1/runs/{run}/evals"): "run_not_found",
        ("GET", f"/api/v1/sweeps/{sweep}"): "sweep_not_found",
        ("POST", f"/api/v1/sweeps/{sweep}/cancel"): "sweep_not_found",
        ("GET", f"/api/v1/projects/{b}"): "project_not_found",
        ("GET", f"/api/v1/projects/{b}/tokens"): "project_not_found",
        ("POST", f"/api/v1/projects/{b}/tokens"): "project_not_found",
    }
    for role, headers in two_projects["tokens"].items():
        for (method, url), code in expected.items():
            body = {"name": "x", "role": "ci"}
            answer = runs_client.request(method, url, headers=headers, json=body)
            assert answer.status_code == 404, (role, url, answer.text)
            assert answer.json()["code"] == code, (role, url)
    assert _counts(db) == before


def test_roles_allow_what_the_table_says_and_refuse_the_rest(
    runs_client: TestClient, two_projects: dict[str, Any], db: Session
) -> None:
    tokens, a_run = two_projects["tokens"], two_projects["a_run"]["id"]
    before = _counts(db)
    refused: dict[str, list[tuple[str, str, Any]]] = {
        "viewer": [
            ("POST", "/api/v1/runs", example_config()),
            ("POST", f"/api/v1/runs/{a_run}/pause", None),
            ("POST", "/api/v1/sweeps", sweep_body()),
        ],
        # a ci token: not on a run it did not create, never resume
        "ci": [
            ("POST", f"/api/v1/runs/{a_run}/pause", None),
            ("POST", f"/api/v1/runs/{a_run}/cancel", None),
            ("POST", f"/api/v1/runs/{a_run}/resume", None),
            ("GET", f"/api/v1/projects/{two_projects['a']}/tokens", None),
        ],
        "member": [
            ("POST", f"/api/v1/projects/{two_projects['a']}/tokens", {"name": "x", "role": "ci"}),
        ],
    }
    for role, calls in refused.items():
        for method, url, body in calls:
            answer = runs_client.request(method, url, json=body, headers=tokens[role])
            assert answer.status_code == 403, (role, url, answer.text)
            assert answer.json()["code"] == "role_forbidden", (role, url)
    viewer_upload = runs_client.post("/api/v1/datasets", content=JSONL, headers=tokens["viewer"])
    assert viewer_upload.status_code == 403
    assert _counts(db) == before
    for role in ("owner", "member", "ci", "viewer"):
        assert runs_client.get(f"/api/v1/runs/{a_run}", headers=tokens[role]).status_code == 200


def test_a_ci_token_pauses_and_cancels_only_its_own_runs(
    runs_client: TestClient, two_projects: dict[str, Any]
) -> None:
    ci, member = two_projects["tokens"]["ci"], two_projects["tokens"]["member"]
    own = _made_run(runs_client, ci, "own")["id"]
    paused = runs_client.post(f"/api/v1/runs/{own}/pause", headers=ci)
    assert paused.status_code == 200 and paused.json()["status"] == "paused"
    assert runs_client.post(f"/api/v1/runs/{own}/resume", headers=ci).status_code == 403
    assert runs_client.post(f"/api/v1/runs/{own}/resume", headers=member).status_code == 200
    cancelled = runs_client.post(f"/api/v1/runs/{own}/cancel", headers=ci)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"


ADMIN_ONLY: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "/api/v1/admin-tokens", None),
    ("POST", "/api/v1/admin-tokens/{token}/revoke", None),
    ("POST", "/api/v1/dashboard-sessions/revoke-all", None),
    ("GET", "/api/v1/workers", None),
    ("POST", "/api/v1/workers/{token}/revoke", None),
    ("GET", "/api/v1/learners", None),
    ("POST", "/api/v1/learners/{token}/revoke", None),
    ("POST", "/api/v1/projects", {"name": "team-c"}),
    ("PATCH", "/api/v1/projects/{project}", {"name": "team-c"}),
]


def test_a_project_token_gets_403_on_every_admin_worker_and_learner_route(
    runs_client: TestClient, two_projects: dict[str, Any], db: Session
) -> None:
    """Admin-only routes take no project token at all (token_kind_forbidden), whatever its role
    and whatever the id, and nothing changes."""
    db.rollback()
    some_token = db.scalar(select(Token.id).where(Token.kind == "admin"))
    db.rollback()
    before = _counts(db)
    for method, url, body in ADMIN_ONLY:
        target = url.format(token=some_token, project=two_projects["a"])
        for role in ("ci", "owner"):
            headers = two_projects["tokens"][role]
            answer = runs_client.request(method, target, json=body, headers=headers)
            assert answer.status_code == 403, (role, target, answer.text)
            assert answer.json()["code"] == "token_kind_forbidden"
    assert _counts(db) == before


def test_bad_input_is_422_only_for_a_role_that_may_make_the_call(
    runs_client: TestClient, two_projects: dict[str, Any], db: Session
) -> None:
    before = _counts(db)
    bad = {**example_config(), "group_size": -1}
    ci = runs_client.post("/api/v1/runs", json=bad, headers=two_projects["tokens"]["ci"])
    assert ci.status_code == 422 and ci.json()["code"] == "validation_failed"
    viewer = runs_client.post("/api/v1/runs", json=bad, headers=two_projects["tokens"]["viewer"])
    assert viewer.status_code == 403 and viewer.json()["code"] == "role_forbidden"
    assert _counts(db) == before


def test_an_admin_still_reaches_every_project(
    runs_client: TestClient, admin: Headers, two_projects: dict[str, Any]
) -> None:
    for run in (two_projects["a_run"], two_projects["b_run"]):
        assert runs_client.get(f"/api/v1/runs/{run['id']}", headers=admin).status_code == 200
    made = _made_run(runs_client, admin, "in-default")
    assert made["project_id"] == str(DEFAULT_PROJECT_ID)


def test_owners_and_members_manage_their_projects_registration_tokens(
    runs_client: TestClient, admin: Headers, two_projects: dict[str, Any], db: Session
) -> None:
    """A member's registration token is of its project (the workers it registers serve only
    that project: tests/server/leases/test_acquire_projects.py); naming another project or
    none is its own or unknown; another project's token is not found; ci and viewer: 403."""
    tokens, url = two_projects["tokens"], "/api/v1/registration-tokens"
    made = runs_client.post(url, json={"name": "w"}, headers=tokens["member"])
    assert made.status_code == 201, made.text
    assert made.json()["project_id"] == two_projects["a"]
    shared = runs_client.post(url, json={"name": "shared"}, headers=admin).json()
    assert shared["project_id"] is None
    before = _counts(db)
    elsewhere = runs_client.post(url, json={"project": "team-b"}, headers=tokens["owner"])
    assert elsewhere.status_code == 422 and elsewhere.json()["code"] == "unknown_project"
    for role in ("ci", "viewer"):
        refused = runs_client.post(url, json={"name": "w"}, headers=tokens[role])
        assert refused.status_code == 403 and refused.json()["code"] == "role_forbidden"
        assert runs_client.get(url, headers=tokens[role]).status_code == 403
    listed = runs_client.get(url, headers=tokens["owner"]).json()
    assert [t["id"] for t in listed] == [made.json()["id"]]
    not_ours = runs_client.post(f"{url}/{shared['id']}/revoke", headers=tokens["owner"])
    assert not_ours.status_code == 404 and not_ours.json()["code"] == "token_not_found"
    assert _counts(db) == before
    ours = runs_client.post(f"{url}/{made.json()['id']}/revoke", headers=tokens["member"])
    assert ours.status_code == 200 and ours.json()["revoked_at"]
