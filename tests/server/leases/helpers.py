"""Test helpers: a run with its dataset and prompt rows, and registered workers.

Runs are inserted the way server/runs/service.py create_run does (status, base_model, priority,
config dump, DatasetRow rows, PromptRow rows for every epoch with queue_pos = epoch*N + i), and
their config is parsed into this process's cache, as create_run leaves it.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from protocol.datasets import generate
from protocol.run_config import InlineDataset, RunConfig
from server.models import DatasetRow, Lease, PromptRow, RolloutBatch, Run, Worker
from server.models.project import DEFAULT_PROJECT_ID
from server.runs import service as runs
from server.tokens import service as tokens
from tests.harness.runs import jsonl, plus_rows, run_config

MODEL = "tiny-model"


# The lease tests' run (a layer of tests/harness/runs.py run_config): 10 rows by default.
LEASE_RUN: dict[str, Any] = {
    "name": "lease-test",
    "base_model": MODEL,
    "prompts_per_step": 4,
    "lease_ttl_s": 60.0,
    "heartbeat_interval_s": 5.0,
}


def make_run(
    session: Session,
    config: RunConfig | None = None,
    *,
    status: str = "running",
    run_id: uuid.UUID | None = None,
    n_rows: int = 10,
    project_id: uuid.UUID = DEFAULT_PROJECT_ID,
    **overrides: Any,
) -> Run:
    """A run of `config`, or else of tests/harness/runs.py's run_config with `LEASE_RUN`,
    `n_rows` rows and `overrides`, in the project (the default one)."""
    config = config or RunConfig.model_validate(
        run_config(LEASE_RUN, dataset=jsonl(plus_rows(n_rows)), **overrides)
    )
    run = Run(
        id=run_id or uuid.uuid4(),
        name=config.name,
        status=status,
        config=config.model_dump(mode="json"),
        base_model=config.base_model,
        priority=config.priority,
        project_id=project_id,
    )
    session.add(run)
    session.flush()
    ds = config.dataset
    rows = ds.rows if isinstance(ds, InlineDataset) else generate(ds.generator, ds.size, ds.seed)  # type: ignore[union-attr]
    dataset_rows = [
        DatasetRow(
            run_id=run.id,
            row_index=i,
            prompt=row["prompt"],
            reference={k: v for k, v in row.items() if k != "prompt"},
        )
        for i, row in enumerate(rows)
    ]
    session.add_all(dataset_rows)
    session.flush()
    n = len(dataset_rows)
    session.add_all(
        PromptRow(
            run_id=run.id,
            dataset_row_id=d.id,
            epoch=e,
            state="queued",
            queue_pos=e * n + i,
        )
        for e in range(config.epochs)
        for i, d in enumerate(dataset_rows)
    )
    session.flush()
    runs.get_config(run)
    return run


def make_worker(
    session: Session,
    *,
    models: list[str] | None = None,
    status: str = "active",
    name: str = "w",
    worker_id: uuid.UUID | None = None,
    project_id: uuid.UUID | None = None,
) -> tuple[Worker, str]:
    """A worker and its token; `project_id` None: the shared fleet."""
    worker = Worker(
        id=worker_id or uuid.uuid4(),
        name=name,
        models=models if models is not None else [MODEL],
        status=status,
        project_id=project_id,
    )
    session.add(worker)
    session.flush()
    minted = tokens.mint(session, "worker", name=name, scope_id=worker.id)
    return worker, minted.plaintext


def snapshot(session: Session, run_id: uuid.UUID) -> dict[str, Any]:
    """Every row the lease engine may touch, for before/after comparisons (the read transaction
    ends, so SQLite's single writer is free again)."""
    session.expire_all()
    state = {
        "run": session.execute(
            select(
                Run.status,
                Run.current_version,
                Run.fencing_seq,
                Run.groups_in_flight,
                Run.queue_head,
                Run.last_lease_at,
            ).where(Run.id == run_id)
        ).all(),
        "leases": session.execute(
            select(Lease.id, Lease.state, Lease.expires_at, Lease.fencing, Lease.end_reason)
            .where(Lease.run_id == run_id)
            .order_by(Lease.id)
        ).all(),
        "rows": session.execute(
            select(
                PromptRow.id,
                PromptRow.state,
                PromptRow.queue_pos,
                PromptRow.attempts,
                PromptRow.lease_id,
                PromptRow.batch_id,
                PromptRow.drop_reason,
            )
            .where(PromptRow.run_id == run_id)
            .order_by(PromptRow.id)
        ).all(),
        "batches": session.execute(
            select(RolloutBatch.id, RolloutBatch.state).where(RolloutBatch.run_id == run_id)
        ).all(),
    }
    session.commit()
    return state


def in_flight(session: Session, run_id: uuid.UUID) -> int:
    return int(
        session.execute(
            select(func.count())
            .select_from(PromptRow)
            .where(
                PromptRow.run_id == run_id,
                PromptRow.state.in_(("leased", "accepted", "claimed")),
            )
        ).scalar_one()
    )


def batch_manifest(lease: dict[str, Any], data: bytes, **over: Any) -> dict[str, Any]:
    """The manifest a worker sends on complete for `data` uploaded under this lease."""
    manifest = {
        "key": lease["batch_key"],
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "n_samples": len(lease["prompts"]) * lease["group_size"],
        "n_tokens": 100,
        "generation_seconds": 1.5,
    }
    return {**manifest, **over}


def work_one_lease(client: Any, headers: dict[str, str]) -> uuid.UUID | None:
    """What a worker does with one lease through the HTTP API: acquire, upload its batch object
    through the presigned URL, complete. The accepted batch's id, or None when acquire
    answers 204."""
    response = client.post("/api/v1/leases/acquire", json={}, headers=headers)
    if response.status_code == 204:
        return None
    assert response.status_code == 200, response.text
    lease = response.json()
    data = json.dumps({"lease": lease["lease_id"], "prompts": lease["prompts"]}).encode()
    sha = hashlib.sha256(data).hexdigest()
    base = f"/api/v1/leases/{lease['lease_id']}"
    body = {"fencing": lease["fencing"], "size": len(data), "sha256": sha}
    up = client.post(f"{base}/upload", json=body, headers=headers)
    assert up.status_code == 200, up.text
    put = up.json()
    stored = client.put(put["url"], content=data, headers=put["headers"])
    assert stored.status_code == 200, stored.text
    manifest = batch_manifest(lease, data, key=put["key"], generation_seconds=0.5)
    body = {"fencing": lease["fencing"], "manifest": manifest}
    done = client.post(f"{base}/complete", json=body, headers=headers)
    assert done.status_code == 200 and done.json()["state"] == "accepted", done.text
    return uuid.UUID(done.json()["batch_id"])


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def acquire_lease(client: Any, token: str) -> dict[str, Any]:
    """A lease through the API (200 required)."""
    response = client.post("/api/v1/leases/acquire", json={}, headers=bearer(token))
    assert response.status_code == 200, response.text
    return dict(response.json())
