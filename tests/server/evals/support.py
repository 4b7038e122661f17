"""Helpers of the eval tests: a run with an eval block, a fake worker and a fake learner that
speak the real HTTP API (the batch objects are opaque bytes: the server never reads them)."""

from __future__ import annotations

import json
import uuid
from typing import Any

from fastapi.testclient import TestClient

from tests.server.learner.support import RunHandle, make_run
from tests.server.leases.helpers import batch_manifest

EVAL_ROWS = [{"prompt": f"What is {i} + 2?", "answer": str(i + 2)} for i in range(3)]


def eval_block(**overrides: Any) -> dict[str, Any]:
    block: dict[str, Any] = {
        "dataset": {"kind": "jsonl", "rows": EVAL_ROWS},
        "every_versions": 2,
        "n": 2,
        "temperature": 0.7,
        "accuracy_reward": "numeric_match",
        "threshold": 1.0,
        "max_leases_in_flight": 1,
    }
    block.update(overrides)
    return block


def eval_run_fields(
    n_rows: int = 6, eval_overrides: Any = None, **overrides: Any
) -> dict[str, Any]:
    """The run config fields of a run with an eval block (make_run's overrides)."""
    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(n_rows)]
    fields: dict[str, Any] = {
        "dataset": {"kind": "jsonl", "rows": rows},
        "eval": eval_block(**(eval_overrides or {})),
    }
    fields.update(overrides)
    return fields


def make_eval_run(
    app: Any, n_rows: int = 6, eval_overrides: Any = None, **overrides: Any
) -> RunHandle:
    return make_run(app, **eval_run_fields(n_rows, eval_overrides, **overrides))


def acquire(client: TestClient, headers: dict[str, str]) -> dict[str, Any] | None:
    response = client.post("/api/v1/leases/acquire", json={}, headers=headers)
    if response.status_code == 204:
        return None
    assert response.status_code == 200, response.text
    return dict(response.json())


def finish(client: TestClient, headers: dict[str, str], lease: dict[str, Any]) -> Any:
    """Upload an opaque batch object for the lease and complete it; the complete response."""
    data = json.dumps({"lease": lease["lease_id"], "kind": lease["kind"]}).encode()
    base = f"/api/v1/leases/{lease['lease_id']}"
    up = client.post(
        f"{base}/upload",
        json={
            "fencing": lease["fencing"],
            "size": len(data),
            "sha256": batch_manifest(lease, data)["sha256"],
        },
        headers=headers,
    )
    if up.status_code != 200:
        return up
    put = up.json()
    assert client.put(put["url"], content=data, headers=put["headers"]).status_code == 200
    manifest = batch_manifest(lease, data, key=put["key"])
    return client.post(
        f"{base}/complete",
        json={"fencing": lease["fencing"], "manifest": manifest},
        headers=headers,
    )


def drain(client: TestClient, headers: dict[str, str]) -> list[dict[str, Any]]:
    """Acquire and complete leases until acquire answers 204; the leases, in order."""
    leases = []
    while (lease := acquire(client, headers)) is not None:
        done = finish(client, headers, lease)
        assert done.status_code == 200 and done.json()["state"] == "accepted", done.text
        leases.append(lease)
        assert len(leases) < 100
    return leases


def accurate(item_id: int) -> bool:
    """The fake learner's verdict: items with an even id are right on every sample."""
    return item_id % 2 == 0


def score_evals(client: TestClient, run: RunHandle, fencing: int) -> list[dict[str, Any]]:
    """Claim every uploaded eval batch and post its scores; the results responses."""
    answers = []
    body = client.post(
        run.url("evals/claim"), json={"fencing": fencing, "max_batches": 64}, headers=run.headers
    )
    assert body.status_code == 200, body.text
    for batch in body.json()["batches"]:
        assert all("answer" in p["reference"] for p in batch["prompts"])
        samples = [
            {
                "item_id": p["item_id"],
                "reward": 1.0 if accurate(p["item_id"]) else 0.25,
                "accuracy_value": 1.0 if accurate(p["item_id"]) else 0.0,
            }
            for p in batch["prompts"]
            for _ in range(batch["n"])
        ]
        posted = client.post(
            run.url("evals"),
            json={"fencing": fencing, "batch_id": batch["batch_id"], "samples": samples},
            headers=run.headers,
        )
        assert posted.status_code == 200, posted.text
        answers.append(posted.json())
    return answers


def worker_headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def new_id() -> str:
    return str(uuid.uuid4())
