"""Run configs whose numbers the lease engine cannot store are refused at creation (422), and
the largest accepted ones still lease (found by the API fuzzer's probes: a run created with an
unbounded group_size, max_staleness, weight_sync_steps or lease_ttl_s made every acquire a 500).
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from protocol.run_config import MAX_ADMISSION_BOUND, MAX_GROUP_SIZE
from tests.conftest import mint_token
from tests.server.runs.conftest import example_config


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"group_size": MAX_GROUP_SIZE + 1}, "group_size"),
        ({"lease_ttl_s": 1e300}, "lease_ttl_s"),
        ({"max_staleness": 2**40}, "max_staleness"),
        ({"weight_sync_steps": 2**40}, "max_staleness"),
    ],
)
def test_out_of_range_refused(runs_client, admin, overrides, field) -> None:  # type: ignore[no-untyped-def]
    response = runs_client.post("/api/v1/runs", json=example_config(**overrides), headers=admin)
    assert response.status_code == 422, response.text
    assert field in [e["field"] for e in response.json()["errors"]]


@pytest.mark.postgres
def test_largest_accepted_config_leases(client: TestClient, admin_headers) -> None:  # type: ignore[no-untyped-def]
    per_step = 8
    steps = 1000
    staleness = MAX_ADMISSION_BOUND // (steps * per_step) - 1
    config = example_config(
        group_size=MAX_GROUP_SIZE,
        lease_ttl_s=86_400.0,
        max_staleness=staleness,
        weight_sync_steps=steps,
        prompts_per_step=per_step,
    )
    created = client.post("/api/v1/runs", json=config, headers=admin_headers)
    assert created.status_code == 201, created.text
    run_id, learner = created.json()["run"]["id"], created.json()["learner_token"]
    attach = client.post(
        f"/api/v1/runs/{run_id}/learner/attach",
        json={"tokenizer_fingerprint": "fp"},
        headers={"Authorization": f"Bearer {learner}"},
    )
    assert attach.status_code == 200, attach.text
    registration = mint_token(client.app, "registration")
    worker = client.post(
        "/api/v1/workers/register",
        json={"name": "w", "models": [config["base_model"]]},
        headers={"Authorization": f"Bearer {registration}"},
    )
    assert worker.status_code == 201, worker.text
    headers = {"Authorization": f"Bearer {worker.json()['token']}"}
    lease = client.post("/api/v1/leases/acquire", json={}, headers=headers)
    assert lease.status_code == 200, lease.text
    assert lease.json()["group_size"] == MAX_GROUP_SIZE
    beat = client.post(
        f"/api/v1/leases/{lease.json()['lease_id']}/heartbeat",
        json={"fencing": lease.json()["fencing"]},
        headers=headers,
    )
    assert beat.status_code == 200, beat.text
