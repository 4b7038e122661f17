"""complete refuses a manifest whose sha256 is not the one the upload URL was signed with (the
object store enforced that digest on the PUT): 422, nothing changed, a correct complete after."""

from __future__ import annotations

import hashlib
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from tests.server.leases.helpers import (
    acquire_lease,
    batch_manifest,
    bearer,
    make_run,
    make_worker,
    snapshot,
)


def _post(client: TestClient, token: str, lease: dict[str, Any], op: str, **body: Any) -> Any:
    return client.post(
        f"/api/v1/leases/{lease['lease_id']}/{op}",
        json={"fencing": lease["fencing"], **body},
        headers=bearer(token),
    )


def test_complete_with_another_sha256_than_the_signed_one_is_422(
    lease_client: TestClient, db: Session
) -> None:
    run = make_run(db, n_rows=4)
    _, token = make_worker(db)
    db.commit()
    lease = acquire_lease(lease_client, token)
    data = b"the batch the worker really uploaded"
    signed = hashlib.sha256(data).hexdigest()
    up = _post(lease_client, token, lease, "upload", size=len(data), sha256=signed)
    assert up.status_code == 200, up.text
    put = up.json()
    assert lease_client.put(put["url"], content=data, headers=put["headers"]).status_code == 200
    before = snapshot(db, run.id)
    forged = batch_manifest(lease, data, key=put["key"], sha256="0" * 64)
    answer = _post(lease_client, token, lease, "complete", manifest=forged)
    assert answer.status_code == 422, answer.text
    assert answer.json()["field"] == "manifest.sha256"
    assert snapshot(db, run.id) == before
    honest = batch_manifest(lease, data, key=put["key"])
    answer = _post(lease_client, token, lease, "complete", manifest=honest)
    assert answer.status_code == 200 and answer.json()["state"] == "accepted", answer.text
