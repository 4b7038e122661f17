"""Helpers for the learner-side tests: runs and workers made in the real database (batches:
tests/harness/batches.py), and the learner's upload + publish done over HTTP."""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select, update

from protocol.run_config import RunConfig
from server.db import transaction
from server.db_types import db_now_plus
from server.learner.retention import apply_retention
from server.models import AdapterVersion, PromptRow, RolloutBatch, Run, Worker
from server.runs.service import create_run
from tests.conftest import mint_token
from tests.harness.batches import FP
from tests.harness.runs import run_config


@dataclass
class RunHandle:
    id: uuid.UUID
    token: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def url(self, path: str) -> str:
        return f"/api/v1/runs/{self.id}/{path}"


def make_run(app: Any, **overrides: Any) -> RunHandle:
    """A pending run created by the runs feature (dataset rows, every epoch's prompt rows
    queued, epoch 0 first) and its learner token."""
    config = RunConfig.model_validate(run_config({"name": "learner-test"}, **overrides))
    with transaction(app.state.sessionmaker) as session:
        run, token = create_run(session, config)
        run_id = run.id
    return RunHandle(run_id, token)


def make_worker(app: Any) -> tuple[uuid.UUID, str]:
    with transaction(app.state.sessionmaker) as session:
        worker = Worker(name="w", models=["smollm2-135m-instruct"], status="active")
        session.add(worker)
        session.flush()
        worker_id = worker.id
    return worker_id, mint_token(app, "worker", name="w", scope_id=worker_id)


def attach(client: TestClient, run: RunHandle, fp: str = FP) -> dict[str, Any]:
    response = client.post(
        run.url("learner/attach"), json={"tokenizer_fingerprint": fp}, headers=run.headers
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


def claim(
    client: TestClient,
    run: RunHandle,
    fencing: int,
    max_groups: int = 100,
    *,
    target_version: int | None = None,
) -> Any:
    body: dict[str, Any] = {"fencing": fencing, "max_groups": max_groups}
    if target_version is not None:
        body["target_version"] = target_version
    return client.post(run.url("batches/claim"), json=body, headers=run.headers)


def _files(version: int, checkpoint: bool = True) -> dict[str, tuple[str, bytes]]:
    files = {
        "adapter_config.json": ("adapter", json.dumps({"r": 8, "v": version}).encode()),
        "adapter_model.safetensors": ("adapter", f"weights of v{version}".encode() * 8),
        "trainer_state.json": ("checkpoint", json.dumps({"step": version}).encode()),
    }
    if not checkpoint:
        del files["trainer_state.json"]
    return files


def upload(
    client: TestClient, run: RunHandle, fencing: int, version: int, *, checkpoint: bool = True
) -> Any:
    """Ask for the presigned PUTs and upload through them; returns the uploads response."""
    files = _files(version, checkpoint)
    body = {
        "fencing": fencing,
        "version": version,
        "files": [
            {"name": n, "size": len(d), "sha256": hashlib.sha256(d).hexdigest(), "kind": k}
            for n, (k, d) in files.items()
        ],
    }
    response = client.post(run.url("uploads"), json=body, headers=run.headers)
    if response.status_code != 200:
        return response
    for up in response.json()["uploads"]:
        put = client.put(up["url"], content=files[up["name"]][1], headers=up["headers"])
        assert put.status_code in (200, 201), put.text
    return response


def publish_body(
    run: RunHandle,
    fencing: int,
    version: int,
    batch_ids: list[uuid.UUID] | list[str] = (),  # type: ignore[assignment]
    *,
    final: bool = False,
    checkpoint: bool = True,
) -> dict[str, Any]:
    def entry(name: str, kind: str, data: bytes) -> dict[str, Any]:
        folder = "adapters" if kind == "adapter" else "checkpoints"
        return {
            "name": name,
            "key": f"runs/{run.id}/{folder}/v{version:06d}/{name}",
            "sha256": hashlib.sha256(data).hexdigest(),
            "size": len(data),
        }

    files = _files(version, checkpoint)
    return {
        "fencing": fencing,
        "version": version,
        "files": [entry(n, k, d) for n, (k, d) in files.items() if k == "adapter"],
        "checkpoint_files": [entry(n, k, d) for n, (k, d) in files.items() if k == "checkpoint"],
        "learner_step": version,
        "metrics": {"loss": 0.5},
        "consumed_batch_ids": [str(b) for b in batch_ids],
        "final": final,
    }


def upload_and_publish(
    client: TestClient,
    run: RunHandle,
    fencing: int,
    version: int,
    batch_ids: list[uuid.UUID] | list[str] = (),  # type: ignore[assignment]
    *,
    final: bool = False,
    checkpoint: bool = True,
) -> Any:
    """Upload and publish `version`; without `checkpoint` it carries no checkpoint files."""
    up = upload(client, run, fencing, version, checkpoint=checkpoint)
    assert up.status_code == 200, up.text
    body = publish_body(run, fencing, version, batch_ids, final=final, checkpoint=checkpoint)
    return client.post(run.url("adapters"), json=body, headers=run.headers)


def run_row(app: Any, run_id: uuid.UUID) -> Run:
    with transaction(app.state.sessionmaker) as session:
        run = session.get(Run, run_id)
        assert run is not None
        session.expunge(run)
        return run


def batch_states(app: Any, run_id: uuid.UUID) -> dict[uuid.UUID, str]:
    with transaction(app.state.sessionmaker) as session:
        return dict(
            session.execute(
                select(RolloutBatch.id, RolloutBatch.state).where(RolloutBatch.run_id == run_id)
            ).all()
        )


def row_states(app: Any, run_id: uuid.UUID) -> dict[int, tuple[str, int, str | None]]:
    with transaction(app.state.sessionmaker) as session:
        return {
            r.id: (r.state, r.attempts, r.drop_reason)
            for r in session.execute(select(PromptRow).where(PromptRow.run_id == run_id)).scalars()
        }


def expire_learner(app: Any, run_id: uuid.UUID) -> None:
    """The learner lease runs out now (database time), as if its learner had died."""
    with transaction(app.state.sessionmaker) as session:
        session.execute(
            update(Run).where(Run.id == run_id).values(learner_expires_at=db_now_plus(-1.0))
        )


def version_keys(app: Any, run_id: uuid.UUID, version: int) -> set[str]:
    """Every bucket key of the version's files (adapter and checkpoint)."""
    with transaction(app.state.sessionmaker) as session:
        row = session.execute(
            select(AdapterVersion).where(
                AdapterVersion.run_id == run_id, AdapterVersion.version == version
            )
        ).scalar_one()
        return {m["key"] for m in [*row.files.values(), *row.checkpoint_files.values()]}


def retain(app: Any, run_id: uuid.UUID) -> list[str]:
    """Apply retention to the run now; the deleted keys."""
    with transaction(app.state.sessionmaker) as session:
        return apply_retention(session, app.state.store, run_id)


def deleted_versions(app: Any, run_id: uuid.UUID) -> list[int]:
    with transaction(app.state.sessionmaker) as session:
        return sorted(
            session.execute(
                select(AdapterVersion.version).where(
                    AdapterVersion.run_id == run_id, AdapterVersion.deleted.is_(True)
                )
            ).scalars()
        )
