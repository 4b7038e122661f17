"""Each audited API call writes one entry, in its own transaction, with who, what and where
(docs/guides/audit.md, "What is recorded"), on Postgres and SQLite."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient

from server.audit.recorder import Audit
from server.models.project import DEFAULT_PROJECT_ID
from tests.conftest import mint_token
from tests.server.audit.conftest import bearer, entries
from tests.server.learners.conftest import register_body
from tests.server.runs.conftest import example_config
from tests.server.sweeps.conftest import sweep_body

pytestmark = pytest.mark.timeout(180)


def _ok(answer: Any, status: int = 200) -> Any:
    assert answer.status_code == status, answer.text
    return answer.json() if answer.content else None


def _admin_calls(client: TestClient, admin: dict[str, str]) -> list[tuple[str, str, str]]:
    """The admin's calls, each with the (action, object_type, object_id) it must record."""
    expected = []
    project = _ok(client.post("/api/v1/projects", json={"name": "team-a"}, headers=admin), 201)
    expected.append(("project.create", "project", project["id"]))
    path = f"/api/v1/projects/{project['id']}"
    _ok(client.patch(path, json={"name": "team-b"}, headers=admin))
    expected.append(("project.rename", "project", project["id"]))
    created = client.post(
        "/api/v1/runs", params={"project": "team-b"}, json=example_config(), headers=admin
    )
    run_id = _ok(created, 201)["run"]["id"]
    expected.append(("run.create", "run", run_id))
    for action in ("pause", "resume", "cancel"):
        _ok(client.post(f"/api/v1/runs/{run_id}/{action}", headers=admin))
        expected.append((f"run.{action}", "run", run_id))
    sweep = _ok(client.post("/api/v1/sweeps", json=sweep_body("s"), headers=admin), 201)
    sweep_id = sweep["sweep"]["id"]
    expected.append(("sweep.create", "sweep", sweep_id))
    _ok(client.post(f"/api/v1/sweeps/{sweep_id}/cancel", headers=admin))
    expected.append(("sweep.cancel", "sweep", sweep_id))
    reg = _ok(client.post("/api/v1/registration-tokens", json={"max_uses": 3}, headers=admin), 201)
    expected.append(("token.create", "token", reg["id"]))
    return expected


def test_each_audited_call_writes_one_entry(
    runs_client: TestClient, runs_app: Any, admin: dict[str, str]
) -> None:
    expected = _admin_calls(runs_client, admin)
    reg_token = mint_token(runs_app, "registration", name="fleet", max_uses=3)
    worker = runs_client.post(
        "/api/v1/workers/register", json={"name": "w1"}, headers=bearer(reg_token)
    )
    worker_id = _ok(worker, 201)["id"]
    expected.append(("worker.register", "worker", worker_id))
    for action in ("trust", "untrust", "revoke"):
        _ok(runs_client.post(f"/api/v1/workers/{worker_id}/{action}", headers=admin))
        expected.append((f"worker.{action}", "worker", worker_id))
    learner = runs_client.post(
        "/api/v1/learners/register", json=register_body(), headers=bearer(reg_token)
    )
    learner_id = _ok(learner, 201)["learner_id"]
    expected.append(("learner.register", "learner", learner_id))
    _ok(runs_client.post(f"/api/v1/learners/{learner_id}/revoke", headers=admin))
    expected.append(("learner.revoke", "learner", learner_id))
    dataset = runs_client.post(
        "/api/v1/datasets", content=b'{"prompt": "1+1", "answer": "2"}\n', headers=admin
    )
    dataset_id = _ok(dataset, 202)["id"]
    expected.append(("dataset.upload", "dataset", dataset_id))
    _ok(runs_client.delete(f"/api/v1/datasets/{dataset_id}", headers=admin), 204)
    expected.append(("dataset.delete", "dataset", dataset_id))
    second = mint_token(runs_app, "admin", name="second")
    second_id = str(entries_token_id(runs_app, second))
    _ok(runs_client.post(f"/api/v1/admin-tokens/{second_id}/revoke", headers=admin))
    expected.append(("token.revoke", "token", second_id))
    _ok(runs_client.post("/api/v1/dashboard-sessions/revoke-all", headers=admin))
    expected.append(("dashboard.logout_everywhere", "dashboard_session", None))  # type: ignore[arg-type]

    rows = entries(runs_app)
    assert [(r.action, r.object_type, r.object_id) for r in rows] == expected
    assert {r.outcome for r in rows} == {"ok"} and {r.count for r in rows} == {1}
    assert {r.source for r in rows} == {"testclient"}  # the TestClient's peer address
    by_admin = [r for r in rows if not r.action.endswith(".register")]
    assert {(r.token_name, r.role) for r in by_admin} == {("t", "admin")}
    registered = [r for r in rows if r.action.endswith(".register")]
    assert {(r.token_name, r.role) for r in registered} == {("fleet", "registration")}
    assert all(r.token_id is not None and r.token_prefix for r in rows)
    projects = {r.action: r.project_id for r in rows}
    team = uuid.UUID(expected[0][2])
    assert projects["project.rename"] == team and projects["run.cancel"] == team
    assert projects["sweep.create"] == DEFAULT_PROJECT_ID
    assert projects["dataset.delete"] == DEFAULT_PROJECT_ID  # read before the row went
    assert projects["worker.revoke"] is None  # the shared fleet


def entries_token_id(app: Any, plaintext: str) -> uuid.UUID:
    from server.db import transaction
    from server.tokens import service as tokens

    with transaction(app.state.sessionmaker) as session:
        token = tokens.identify(session, plaintext)
        assert token is not None
        return token.id


def test_a_refused_change_writes_no_entry(runs_client: TestClient, runs_app: Any, admin) -> None:  # type: ignore[no-untyped-def]
    _ok(runs_client.post("/api/v1/projects", json={"name": "team-a"}, headers=admin), 201)
    taken = runs_client.post("/api/v1/projects", json={"name": "team-a"}, headers=admin)
    assert taken.status_code == 409
    missing = runs_client.post(f"/api/v1/runs/{uuid.uuid4()}/pause", headers=admin)
    assert missing.status_code == 404
    assert [r.action for r in entries(runs_app)] == ["project.create"]


def test_the_entry_and_the_change_commit_or_roll_back_together(
    runs_app: Any, admin: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure after the entry is written (here, the recorder itself raising once it has
    flushed) leaves neither the entry nor the project: one transaction."""
    original = Audit.record

    def record_then_fail(self: Audit, *args: Any, **kwargs: Any) -> Any:
        original(self, *args, **kwargs)
        raise RuntimeError("after the entry")

    monkeypatch.setattr(Audit, "record", record_then_fail)
    with TestClient(runs_app, raise_server_exceptions=False) as client:
        failed = client.post("/api/v1/projects", json={"name": "team-a"}, headers=admin)
        assert failed.status_code == 500
        monkeypatch.setattr(Audit, "record", original)
        names = [p["name"] for p in client.get("/api/v1/projects", headers=admin).json()]
    assert names == ["default"]
    assert entries(runs_app, outcome="ok") == []


def test_the_first_starts_admin_token_is_recorded(sqlite_url: str) -> None:
    from server.app import mint_first_admin_token
    from server.db import make_engine, make_sessionmaker
    from server.migrate import upgrade
    from tests.server.audit.conftest import entries_in

    engine = make_engine(sqlite_url)
    upgrade(engine)
    factory = make_sessionmaker(engine)
    mint_first_admin_token(factory)
    mint_first_admin_token(factory)  # there is one now: nothing minted, nothing recorded
    [entry] = entries_in(factory)
    engine.dispose()
    assert (entry.action, entry.source, entry.token_id) == ("token.create", "server", None)
    assert entry.detail == {"kind": "admin", "via": "the first start"}
