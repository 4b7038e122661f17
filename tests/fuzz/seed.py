"""Real objects for the API fuzzer, made through the API itself on a fresh Postgres database.

`seed(app)` leaves behind: an admin token; an owner's token of another project (`fuzz-other`,
where none of these objects is); the `arithmetic` example run (created with
POST /api/v1/runs, its learner attached so it is `running`) and its learner token; a
registration token; a registered worker and its token; a registered pool learner's token (its
model is no run's, so the fuzzer's takes leave the runs alone); one accepted batch (lease acquired,
object uploaded through the presigned /blobs URL, lease completed) and one active lease.
A second run and a second worker are there for the fuzzer's destructive calls
(pause/resume/cancel, revoke), so that those do not end the live objects early.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from tests.conftest import mint_token
from tests.server.leases.helpers import work_one_lease

EXAMPLE_RUN = Path(__file__).resolve().parents[2] / "examples" / "runs" / "arithmetic.json"
FINGERPRINT = "fuzz-tokenizer-fp"


@dataclass
class Seeded:
    admin: str
    project: str
    learner: str
    registration: str
    pool_learner: str
    worker: str
    run_id: uuid.UUID
    victim_run_id: uuid.UUID
    worker_id: uuid.UUID
    victim_worker_id: uuid.UUID
    lease_id: uuid.UUID
    lease_fencing: int
    batch_id: uuid.UUID

    def token(self, kind: str) -> str:
        return str(getattr(self, kind))


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _ok(response: Any, status: int = 200) -> dict[str, Any]:
    assert response.status_code == status, (response.status_code, response.text)
    body: dict[str, Any] = response.json()
    return body


def _create_run(client: TestClient, admin: str, name: str) -> tuple[uuid.UUID, str]:
    config = json.loads(EXAMPLE_RUN.read_text())
    config["name"] = name
    created = _ok(client.post("/api/v1/runs", json=config, headers=_bearer(admin)), 201)
    return uuid.UUID(created["run"]["id"]), created["learner_token"]


def _register(client: TestClient, registration: str, name: str) -> tuple[uuid.UUID, str]:
    body = {"name": name, "gpu_type": "cpu", "models": ["smollm2-135m-instruct"]}
    response = client.post("/api/v1/workers/register", json=body, headers=_bearer(registration))
    out = _ok(response, 201)
    return uuid.UUID(out["id"]), out["token"]


def _accepted_batch(client: TestClient, worker: str) -> uuid.UUID:
    batch = work_one_lease(client, _bearer(worker))
    assert batch is not None, "no lease for the fuzz seed"
    return batch


def seed(app: Any) -> Seeded:
    admin = mint_token(app, "admin", name="fuzz")
    with TestClient(app) as client:
        run_id, learner = _create_run(client, admin, "fuzz-live")
        victim_run_id, _ = _create_run(client, admin, "fuzz-victim")
        other = _ok(
            client.post("/api/v1/projects", json={"name": "fuzz-other"}, headers=_bearer(admin)),
            201,
        )
        owner = {"name": "fuzz-owner", "role": "owner"}
        project = _ok(
            client.post(
                f"/api/v1/projects/{other['id']}/tokens", json=owner, headers=_bearer(admin)
            ),
            201,
        )["token"]
        reg_body = {"name": "fuzz", "ttl_hours": 24, "max_uses": 10}
        reg = _ok(
            client.post("/api/v1/registration-tokens", json=reg_body, headers=_bearer(admin)), 201
        )["token"]
        worker_id, worker = _register(client, reg, "fuzz-worker")
        victim_worker_id, _ = _register(client, reg, "fuzz-victim")
        pool = {
            "name": "fuzz-pool",
            "model": "fuzz/no-such-model",
            "tokenizer_fingerprint": "fuzz-pool-fp",
            "max_runs": 2,
        }
        pool_learner = _ok(
            client.post("/api/v1/learners/register", json=pool, headers=_bearer(reg)), 201
        )["learner_token"]
        attach = {"tokenizer_fingerprint": FINGERPRINT, "name": "fuzz-learner"}
        _ok(
            client.post(
                f"/api/v1/runs/{run_id}/learner/attach", json=attach, headers=_bearer(learner)
            )
        )
        batch_id = _accepted_batch(client, worker)
        lease = _ok(client.post("/api/v1/leases/acquire", json={}, headers=_bearer(worker)))
    return Seeded(
        admin=admin,
        project=project,
        learner=learner,
        registration=reg,
        pool_learner=pool_learner,
        worker=worker,
        run_id=run_id,
        victim_run_id=victim_run_id,
        worker_id=worker_id,
        victim_worker_id=victim_worker_id,
        lease_id=uuid.UUID(lease["lease_id"]),
        lease_fencing=int(lease["fencing"]),
        batch_id=batch_id,
    )
