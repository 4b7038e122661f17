"""Every acquire answer carries X-Asyncgrpo-Versions: the current version of each running run of
the worker's base models (docs/architecture/protocol.md, "Worker calls")."""

from __future__ import annotations

import uuid

from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.orm import Session

from protocol import layout
from protocol.client import AsyncGrpoClient
from protocol.schemas import VERSIONS_HEADER, parse_versions_header
from server.models import AdapterVersion, Run
from tests.server.leases.helpers import acquire_lease, bearer, make_run, make_worker

ACQUIRE = "/api/v1/leases/acquire"


def _at_version(db: Session, run: Run, version: int) -> None:
    key = layout.adapter_key(run.id, version, "adapter_model.safetensors")
    files = {"adapter_model.safetensors": {"key": key, "sha256": "a" * 64, "bytes": 3}}
    db.add(
        AdapterVersion(
            run_id=run.id, version=version, files=files, sha256="b" * 64, bytes=3, learner_step=1
        )
    )
    db.execute(update(Run).where(Run.id == run.id).values(current_version=version))


def test_the_200_and_the_204_carry_the_versions_of_the_served_running_runs(
    lease_client: TestClient, db: Session
) -> None:
    fresh = make_run(db, n_rows=2, epochs=1)
    published = make_run(db, n_rows=2, epochs=1)
    _at_version(db, published, 3)
    make_run(db, n_rows=2, status="paused")
    make_run(db, n_rows=2, base_model="another-model")
    _, token = make_worker(db)
    db.commit()
    expected = {fresh.id: 0, published.id: 3}
    for _ in range(2):  # each run's two rows, one lease each
        response = lease_client.post(ACQUIRE, json={}, headers=bearer(token))
        assert response.status_code == 200, response.text
        assert parse_versions_header(response.headers[VERSIONS_HEADER]) == expected
    empty = lease_client.post(ACQUIRE, json={}, headers=bearer(token))
    assert empty.status_code == 204 and empty.content == b""
    assert parse_versions_header(empty.headers[VERSIONS_HEADER]) == expected
    # Narrowing the models narrows what is granted, not what the worker is told.
    narrowed = lease_client.post(ACQUIRE, json={"models": []}, headers=bearer(token))
    assert parse_versions_header(narrowed.headers[VERSIONS_HEADER]) == expected


def test_a_worker_serving_no_running_run_gets_an_empty_header(
    lease_client: TestClient, db: Session
) -> None:
    _, token = make_worker(db)
    db.commit()
    response = lease_client.post(ACQUIRE, json={}, headers=bearer(token))
    assert response.status_code == 204 and response.headers[VERSIONS_HEADER] == ""


def test_the_client_returns_the_lease_and_the_versions(
    lease_client: TestClient, db: Session
) -> None:
    run = make_run(db, n_rows=2, epochs=1)
    _, token = make_worker(db)
    db.commit()
    client = AsyncGrpoClient("http://testserver", token, http=lease_client)
    lease, versions = client.acquire_lease_and_versions()
    assert lease is not None and lease.run_id == run.id and versions == {run.id: 0}
    assert client.acquire_lease_and_versions() == (None, {run.id: 0})
    assert client.acquire_lease() is None


def test_the_header_parses_as_written() -> None:
    a, b = uuid.uuid4(), uuid.uuid4()
    assert parse_versions_header(f"{a}=0,{b}=12") == {a: 0, b: 12}
    assert parse_versions_header("") == parse_versions_header(None) == {}


def test_a_lease_answer_is_unchanged_by_the_header(lease_client: TestClient, db: Session) -> None:
    make_run(db, n_rows=2)
    _, token = make_worker(db)
    db.commit()
    lease = acquire_lease(lease_client, token)
    assert set(lease) >= {"lease_id", "run_id", "fencing", "prompts"}
