"""The learner side driven by the real worker calls (acquire → upload → complete), through a
whole epoch to completion, with the ledger balancing."""

from __future__ import annotations

import hashlib

from tests.server.learner.support import attach, claim, make_run, make_worker, upload_and_publish
from tests.server.leases.helpers import work_one_lease


def test_epoch_through_worker_calls_to_completion(app, client, admin_headers) -> None:
    run = make_run(app, max_staleness=1, prompts_per_step=2)
    _, worker_token = make_worker(app)
    worker = {"Authorization": f"Bearer {worker_token}"}
    assert work_one_lease(client, worker) is None  # pending until the learner attaches
    fencing = attach(client, run)["fencing"]

    version = 0
    while True:
        work_one_lease(client, worker)
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
