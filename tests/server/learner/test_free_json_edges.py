"""Issue 17 items 9 and 10 on both databases: free-form JSON (publish metrics, metric point values,
reward kwargs, reference columns) nested too deep, holding NaN/Infinity or too large is a 422
naming the field, never a 500 now or on a later read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import make_settings, mint_token
from tests.harness.runs import jsonl, run_config
from tests.server.learner.support import attach, make_run, publish_body, upload


@pytest.fixture
def settings(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    return make_settings(db_url, tmp_path / "bucket")


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth):
        value = {"a": value}
    return value


def post_raw(client: TestClient, url: str, body: Any, headers: dict[str, str]) -> Any:
    """Python's json writes NaN/Infinity literals, as a hostile client would send them."""
    return client.post(
        url,
        content=json.dumps(body).encode(),
        headers={**headers, "Content-Type": "application/json"},
    )


def fields(response: Any) -> list[str]:
    assert response.status_code == 422, response.text
    return [str(e["field"]) for e in response.json()["errors"]]


@pytest.mark.parametrize(
    "metrics", [nested(300), {"loss": float("nan")}, {"x": [float("inf")]}, {"s": "x" * 70_000}]
)
def test_publish_metrics_are_bounded_and_the_run_stays_readable(
    client: TestClient, app, admin_headers: dict[str, str], metrics: Any
) -> None:  # type: ignore[no-untyped-def]
    run = make_run(app)
    fencing = attach(client, run)["fencing"]
    assert upload(client, run, fencing, 1).status_code == 200
    body = {**publish_body(run, fencing, 1), "metrics": metrics}
    assert fields(post_raw(client, run.url("adapters"), body, run.headers)) == ["metrics"]
    good = publish_body(run, fencing, 1)
    assert client.post(run.url("adapters"), json=good, headers=run.headers).status_code == 200
    adapters = client.get(f"/api/v1/runs/{run.id}/adapters", headers=admin_headers)
    assert adapters.status_code == 200, adapters.text


def test_publish_metrics_at_the_depth_limit_are_stored(client: TestClient, app) -> None:  # type: ignore[no-untyped-def]
    run = make_run(app)
    fencing = attach(client, run)["fencing"]
    assert upload(client, run, fencing, 1).status_code == 200
    body = {**publish_body(run, fencing, 1), "metrics": {"deep": nested(31)}}
    assert client.post(run.url("adapters"), json=body, headers=run.headers).status_code == 200


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_metric_points_must_be_finite(client: TestClient, app, value: float) -> None:  # type: ignore[no-untyped-def]
    run = make_run(app)
    fencing = attach(client, run)["fencing"]
    body = {"fencing": fencing, "points": [{"step": 1, "values": {"loss": value}}]}
    assert fields(post_raw(client, run.url("metrics"), body, run.headers)) == ["points.0.values"]


def _run_body(**overrides: Any) -> dict[str, Any]:
    edges = {"name": "edges", "dataset": jsonl([{"prompt": "1 + 1?", "answer": "2"}])}
    return run_config(edges, group_size=8, prompts_per_step=8, **overrides)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"rewards": [{"name": "hash_score", "kwargs": {"salt": nested(300)}}]}, "kwargs"),
        ({"rewards": [{"name": "hash_score", "kwargs": {"salt": float("nan")}}]}, "kwargs"),
        ({"dataset": {"kind": "jsonl", "rows": [{"prompt": "p", "ref": nested(300)}]}}, "rows.0"),
        ({"dataset": {"kind": "jsonl", "rows": [{"prompt": "p", "ref": float("nan")}]}}, "rows.0"),
        ({"dataset": {"kind": "jsonl", "rows": [{"prompt": "p", "r": [float("inf")]}]}}, "rows.0"),
    ],
)
def test_run_creation_bounds_free_form_json(
    client: TestClient, admin_headers: dict[str, str], overrides: dict[str, Any], field: str
) -> None:
    response = post_raw(client, "/api/v1/runs", _run_body(**overrides), admin_headers)
    (where,) = fields(response)
    assert where.endswith(field), where
    assert client.get("/api/v1/runs", headers=admin_headers).json() == []


def test_worker_model_names_are_bounded(client: TestClient, app) -> None:  # type: ignore[no-untyped-def]
    registration = mint_token(app, "registration", name="r", max_uses=5)
    headers = {"Authorization": f"Bearer {registration}"}
    body = {"name": "w", "gpu_type": "L4", "models": ["m" * 501]}
    assert fields(client.post("/api/v1/workers/register", json=body, headers=headers)) == [
        "models.0"
    ]
    body["models"] = [f"m{i}" for i in range(17)]
    assert fields(client.post("/api/v1/workers/register", json=body, headers=headers)) == ["models"]
