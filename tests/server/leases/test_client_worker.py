"""The typed client's worker calls against the real app: a whole lease cycle."""

from __future__ import annotations

import hashlib

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from protocol.client import AsyncGrpoClient, ConflictError
from protocol.schemas import BatchManifest
from tests.server.leases.helpers import make_run, make_worker


def test_worker_cycle_through_the_typed_client(
    lease_client: TestClient,
    lease_app,
    db: Session,  # type: ignore[no-untyped-def]
) -> None:
    make_run(db, n_rows=4)
    _, token = make_worker(db)
    db.commit()
    client = AsyncGrpoClient("http://testserver", token, http=lease_client)
    lease = client.acquire_lease()
    assert lease is not None and len(lease.prompts) == 2
    assert client.heartbeat_lease(lease).abort is False
    data = b"batch" * 20
    sha = hashlib.sha256(data).hexdigest()
    put = client.upload_url(lease, size=len(data), sha256=sha)
    assert put.key == lease.batch_key
    lease_app.state.store.put_bytes(lease.batch_key, data)
    manifest = BatchManifest(
        key=lease.batch_key, sha256=sha, size=len(data), n_samples=4, n_tokens=10,
        generation_seconds=0.1,
    )  # fmt: skip
    assert client.complete_lease(lease, manifest).state == "accepted"
    with pytest.raises(ConflictError):
        client.release_lease(lease)
    second = client.acquire_lease(models=["tiny-model"])
    assert second is not None
    assert client.release_lease(second).released == 2
    assert client.acquire_lease(models=[]) is None
    with pytest.raises(ConflictError, match="registered with"):
        client.acquire_lease(models=["nothing-else"])  # not a model it registered
