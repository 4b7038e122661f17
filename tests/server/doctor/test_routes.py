"""The host checks' routes (docs/architecture/protocol.md, "Host checks") on both databases:
the bearer's own token of each kind, a run's model as each kind may see it, and a bucket probe
through the URLs the server signs, bounded, checked from the server's side and cleaned up."""

from __future__ import annotations

import base64
import hashlib
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from protocol import layout
from protocol.requirements import release
from server.db import transaction
from server.doctor.service import PROBE_BYTES, sweep_probes
from server.jobs.retention import apply_all
from server.models import Project, Run, Token, Worker
from tests.conftest import make_settings, mint_token
from tests.server.learner.support import make_run, make_worker

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def settings(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    return make_settings(db_url, tmp_path / "bucket")


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_each_kind_of_token_is_told_about_itself(app: Any, client: TestClient) -> None:
    run = make_run(app)
    worker_id, worker_token = make_worker(app)
    registration = mint_token(app, "registration", name="reg", max_uses=3)
    pool_id, pool_token = _pool_learner(client, mint_token(app, "registration", name="pool"))
    tokens = {
        "admin": mint_token(app, "admin", name="adm"),
        "registration": registration,
        "worker": worker_token,
        "learner": run.token,
        "pool_learner": pool_token,
    }
    seen = {}
    for kind, token in tokens.items():
        answer = client.get("/api/v1/doctor/token", headers=_bearer(token))
        assert answer.status_code == 200, answer.text
        seen[kind] = answer.json()
        assert token.startswith(seen[kind]["prefix"])
        assert seen[kind]["server_version"] == release()
    assert {kind: body["kind"] for kind, body in seen.items()} == {k: k for k in tokens}
    assert seen["learner"]["run_id"] == str(run.id) and seen["learner"]["worker_id"] is None
    assert seen["worker"]["worker_id"] == str(worker_id) and seen["worker"]["run_id"] is None
    assert seen["pool_learner"]["pool_learner_id"] == pool_id
    assert seen["pool_learner"]["run_id"] is None and seen["learner"]["pool_learner_id"] is None
    assert (seen["registration"]["uses"], seen["registration"]["max_uses"]) == (0, 3)
    assert seen["admin"]["uses"] is None
    # asking uses nothing up: the registration token still has its three uses
    with transaction(app.state.sessionmaker) as session:
        row = session.query(Token).filter(Token.prefix == seen["registration"]["prefix"]).one()
        assert row.uses == 0


def test_a_bad_token_is_refused_with_its_code(app: Any, client: TestClient) -> None:
    registration = mint_token(app, "registration", name="gone")
    admin = mint_token(app, "admin", name="adm")
    rows = client.get("/api/v1/registration-tokens", headers=_bearer(admin)).json()
    (row,) = [r for r in rows if registration.startswith(r["prefix"])]
    client.post(f"/api/v1/registration-tokens/{row['id']}/revoke", headers=_bearer(admin))
    for headers, code in [
        ({}, "token_missing"),
        (_bearer("agr_lrn_" + uuid.uuid4().hex), "token_invalid"),
        (_bearer("not-a-token"), "token_invalid"),
        (_bearer(registration), "token_revoked"),
    ]:
        answer = client.get("/api/v1/doctor/token", headers=headers)
        assert (answer.status_code, answer.json()["code"]) == (401, code)


def test_a_run_model_is_shown_to_hosts_and_a_learner_token_sees_only_its_run(
    app: Any, client: TestClient
) -> None:
    run, other = make_run(app), make_run(app)
    with transaction(app.state.sessionmaker) as session:
        row = session.get(Run, run.id)
        assert row is not None
        row.tokenizer_fingerprint = "f" * 64
    registration = mint_token(app, "registration", name="reg")
    answer = client.get(f"/api/v1/doctor/runs/{run.id}", headers=_bearer(registration))
    assert answer.status_code == 200, answer.text
    assert answer.json() == {
        "run_id": str(run.id),
        "status": "pending",
        "base_model": "smollm2-135m-instruct",
        "tokenizer_fingerprint": "f" * 64,
    }
    own = client.get(f"/api/v1/doctor/runs/{run.id}", headers=run.headers)
    assert own.status_code == 200 and own.json()["tokenizer_fingerprint"] == "f" * 64
    # a pool learner's token sees the runs it holds only
    _, pool_token = _pool_learner(client, mint_token(app, "registration", name="pool"))
    taken = client.post("/api/v1/learners/take", json={"max": 1}, headers=_bearer(pool_token))
    assert taken.status_code == 200, taken.text
    held = taken.json()["held"]
    assert len(held) == 1
    not_held = next(r for r in (run.id, other.id) if str(r) != held[0])
    seen = client.get(f"/api/v1/doctor/runs/{held[0]}", headers=_bearer(pool_token))
    assert seen.status_code == 200, seen.text
    for path, headers in [
        (f"/api/v1/doctor/runs/{not_held}", _bearer(pool_token)),  # a run it does not hold
        (f"/api/v1/doctor/runs/{other.id}", run.headers),  # another run's learner token
        (f"/api/v1/doctor/runs/{uuid.uuid4()}", _bearer(registration)),  # no such run
    ]:
        answer = client.get(path, headers=headers)
        assert (answer.status_code, answer.json()["code"]) == (404, "run_not_found")
    malformed = client.get("/api/v1/doctor/runs/not-a-uuid", headers=_bearer(registration))
    assert malformed.status_code == 422 and malformed.json()["errors"][0]["field"] == "path.run_id"


def test_a_projects_worker_and_registration_token_see_only_its_projects_runs(
    app: Any, client: TestClient
) -> None:
    """invariant 28: what a project's worker may know of runs is what it may serve."""
    ours, theirs = make_run(app), make_run(app)
    with transaction(app.state.sessionmaker) as session:
        team = Project(name="team-a")
        session.add(team)
        session.flush()
        team_id = team.id
        session.execute(update(Run).where(Run.id == ours.id).values(project_id=team_id))
        worker = Worker(name="w", models=["smollm2-135m-instruct"], project_id=team_id)
        session.add(worker)
        session.flush()
        worker_id = worker.id
    worker_token = mint_token(app, "worker", name="w", scope_id=worker_id)
    registration = mint_token(app, "registration", name="reg", project_id=team_id)
    _, shared_worker = make_worker(app)
    for token in (worker_token, registration, shared_worker):
        seen = client.get(f"/api/v1/doctor/runs/{ours.id}", headers=_bearer(token))
        assert seen.status_code == 200, seen.text
    for token in (worker_token, registration):
        hidden = client.get(f"/api/v1/doctor/runs/{theirs.id}", headers=_bearer(token))
        assert (hidden.status_code, hidden.json()["code"]) == (404, "run_not_found")
    shared = client.get(f"/api/v1/doctor/runs/{theirs.id}", headers=_bearer(shared_worker))
    assert shared.status_code == 200


def _pool_learner(client: TestClient, registration: str) -> tuple[str, str]:
    """A registered pool learner of the small model: (its id, its token)."""
    answer = client.post(
        "/api/v1/learners/register",
        json={"name": "pool", "model": "smollm2-135m-instruct", "max_runs": 1,
              "tokenizer_fingerprint": "f" * 64},
        headers=_bearer(registration),
    )  # fmt: skip
    assert answer.status_code == 201, answer.text
    return answer.json()["learner_id"], answer.json()["learner_token"]


def _probe(client: TestClient, token: str) -> dict[str, Any]:
    answer = client.post("/api/v1/doctor/bucket-probes", headers=_bearer(token))
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


def test_a_probe_goes_through_the_signed_urls_and_is_deleted_when_checked(
    app: Any, client: TestClient
) -> None:
    token = mint_token(app, "registration", name="reg")
    probe = _probe(client, token)
    content = base64.b64decode(probe["content_b64"])
    assert len(content) == PROBE_BYTES
    key = layout.probe_key(probe["probe_id"])
    assert app.state.store.head(key) is None  # nothing is written until the host uploads
    path = f"/api/v1/doctor/bucket-probes/{probe['probe_id']}"
    early = client.delete(path, headers=_bearer(token))
    assert (early.status_code, early.json()["code"]) == (404, "bucket_probe_not_found")
    # the signed PUT takes exactly the probe's bytes, once
    other = bytes(PROBE_BYTES)
    refused = client.put(probe["put"]["url"], content=other, headers=probe["put"]["headers"])
    assert (refused.status_code, refused.json()["code"]) == (400, "bad_digest")
    put = client.put(probe["put"]["url"], content=content, headers=probe["put"]["headers"])
    assert put.status_code == 200, put.text
    again = client.put(probe["put"]["url"], content=content, headers=probe["put"]["headers"])
    assert again.status_code == 412
    got = client.get(probe["get_url"])
    assert got.status_code == 200 and got.content == content
    checked = client.delete(path, headers=_bearer(token))
    assert checked.status_code == 200, checked.text
    assert checked.json() == {"probe_id": probe["probe_id"], "size": PROBE_BYTES, "intact": True}
    assert app.state.store.head(key) is None
    twice = client.delete(path, headers=_bearer(token))
    assert (twice.status_code, twice.json()["code"]) == (404, "bucket_probe_not_found")


def test_a_probe_id_not_of_the_form_is_a_422_naming_it(app: Any, client: TestClient) -> None:
    token = mint_token(app, "admin", name="adm")
    for bad in ("12345", "0" * 13 + "-" + "g" * 32, "database.json"):
        answer = client.delete(f"/api/v1/doctor/bucket-probes/{bad}", headers=_bearer(token))
        assert answer.status_code == 422, (bad, answer.text)
        assert answer.json()["errors"][0]["field"] == "path.probe_id"
    # no key outside probes/ can be named: a path with a slash is no route at all
    answer = client.delete("/api/v1/doctor/bucket-probes/..%2F.asyncgrpo%2Fdatabase.json",
                           headers=_bearer(token))  # fmt: skip
    assert answer.status_code in (404, 422) and answer.json()["code"] in (
        "route_not_found", "validation_failed",
    )  # fmt: skip


def test_probes_left_behind_are_swept_by_retention(app: Any) -> None:
    store = app.state.store
    old_ms = int((time.time() - 3600) * 1000)
    old = layout.probe_key(f"{old_ms:013d}-{uuid.uuid4().hex}")
    fresh = layout.probe_key(f"{int(time.time() * 1000):013d}-{uuid.uuid4().hex}")
    unrelated = "probes/not-a-probe"
    for key in (old, fresh, unrelated):
        store.put_bytes(key, hashlib.sha256(key.encode()).digest())
    apply_all(app.state.sessionmaker, store)
    assert store.head(old) is None
    assert store.head(fresh) is not None and store.head(unrelated) is not None
    assert sweep_probes(store, older_than_s=0.0) == [fresh]
