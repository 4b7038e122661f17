"""Regression: numbers beyond what the database columns hold are 422 naming the field, never a
500 (found by the API fuzzer and its probes: fencing, metrics steps, since_step, manifests)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from tests.conftest import make_settings
from tests.fuzz.seed import Seeded, seed

BIG = 2**63


@pytest.fixture
def seeded(pg_url: str, tmp_path: Path) -> Iterator[tuple[TestClient, Seeded]]:
    app = create_app(make_settings(pg_url, tmp_path / "bucket"), migrate=True)
    data = seed(app)
    with TestClient(app) as client:
        yield client, data
    app.state.engine.dispose()


def _field_errors(response) -> set[str]:  # type: ignore[no-untyped-def]
    assert response.status_code == 422, (response.status_code, response.text)
    return {e["field"] for e in response.json()["errors"]}


def test_out_of_range_numbers_are_422(seeded: tuple[TestClient, Seeded]) -> None:
    client, s = seeded
    worker = {"Authorization": f"Bearer {s.worker}"}
    learner = {"Authorization": f"Bearer {s.learner}"}
    admin = {"Authorization": f"Bearer {s.admin}"}
    lease = f"/api/v1/leases/{s.lease_id}"
    run = f"/api/v1/runs/{s.run_id}"
    cases = [
        (f"{lease}/heartbeat", worker, {"fencing": BIG}, "fencing"),
        (f"{lease}/upload", worker, {"fencing": BIG, "size": 1, "sha256": "0" * 64}, "fencing"),
        (f"{lease}/release", worker, {"fencing": BIG}, "fencing"),
        (f"{run}/learner/heartbeat", learner, {"fencing": BIG}, "fencing"),
        (f"{run}/learner/heartbeat", learner, {"fencing": -BIG - 1}, "fencing"),
        (
            f"{run}/metrics",
            learner,
            {"fencing": 1, "points": [{"step": 2**40, "values": {"x": 1.0}}]},
            "points.0.step",
        ),
    ]
    for path, headers, body, field in cases:
        assert field in _field_errors(client.post(path, json=body, headers=headers)), path
    manifest = {
        "key": "k",
        "sha256": "0" * 64,
        "size": BIG,
        "n_samples": 2**40,
        "n_tokens": 2**40,
        "generation_seconds": 1.0,
    }
    fields = _field_errors(
        client.post(
            f"{lease}/complete",
            json={"fencing": s.lease_fencing, "manifest": manifest},
            headers=worker,
        )
    )
    assert {"manifest.size", "manifest.n_samples", "manifest.n_tokens"} <= fields
    since = client.get(f"{run}/metrics", params={"since_step": BIG}, headers=admin)
    assert since.status_code == 422
