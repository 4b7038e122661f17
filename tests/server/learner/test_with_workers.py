"""The learner side driven by the real worker calls (acquire → upload → complete), through a
whole epoch to completion, with the ledger balancing."""

from __future__ import annotations

import hashlib
import json

from tests.server.learner.support import attach, claim, make_run, make_worker, upload_and_publish


def _work_one_lease(client, worker_headers) -> str | None:  # type: ignore[no-untyped-def]
    response = client.post("/api/v1/leases/acquire", json={}, headers=worker_headers)
    if response.status_code == 204:
        return None
    assert response.status_code == 200, response.text
    lease = response.json()
    data = json.dumps({"lease": lease["lease_id"], "prompts": lease["prompts"]}).encode()
    sha = hashlib.sha256(data).hexdigest()
    base = f"/api/v1/leases/{lease['lease_id']}"
    up = client.post(
        f"{base}/upload",
        json={"fencing": lease["fencing"], "size": len(data), "sha256": sha},
        headers=worker_headers,
    ).json()
    assert client.put(up["url"], content=data, headers=up["headers"]).status_code < 300
    manifest = {
        "key": up["key"],
        "sha256": sha,
        "size": len(data),
        "n_samples": len(lease["prompts"]) * lease["group_size"],
        "n_tokens": 100,
        "generation_seconds": 0.5,
    }
    done = client.post(
        f"{base}/complete",
        json={"fencing": lease["fencing"], "manifest": manifest},
        headers=worker_headers,
    )
    assert done.status_code == 200 and done.json()["state"] == "accepted", done.text
    return str(done.json()["batch_id"])


def test_epoch_through_worker_calls_to_completion(app, client, admin_headers) -> None:
    run = make_run(app, max_staleness=1, prompts_per_step=2)
    _, worker_token = make_worker(app)
    worker = {"Authorization": f"Bearer {worker_token}"}
    assert _work_one_lease(client, worker) is None  # pending until the learner attaches
    fencing = attach(client, run)["fencing"]

    version = 0
    while True:
        _work_one_lease(client, worker)
        body = claim(client, run, fencing).json()
        ids = [b["batch_id"] for b in body["batches"]]
        for b in body["batches"]:
            fetched = client.get(b["url"])
            assert hashlib.sha256(fetched.content).hexdigest() == b["sha256"]
            assert all("reference" in p for p in b["prompts"])
        version += 1
        published = upload_and_publish(client, run, fencing, version, ids, final=body["exhausted"])
        assert published.status_code == 200, published.text
        if body["exhausted"]:
            assert published.json()["run_status"] == "completed"
            break
        assert version < 10

    ledger = client.get(run.url("ledger"), headers=admin_headers).json()
    assert ledger["balanced"] is True
    assert ledger["by_state"] == {"consumed": 4}
    proxy = client.get(run.url("metrics"), headers=admin_headers).json()["proxy"]
    assert proxy["batches_by_state"] == {"consumed": 2}
    assert proxy["stale_waste"] == 0.0
