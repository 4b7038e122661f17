"""The OpenAPI schema describes the error bodies the app really sends (found by the API fuzzer:
FastAPI's default 422 model said `detail` was a list, the app sends a string plus `errors`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from server.errors import ErrorBody
from tests.conftest import make_settings, mint_token
from tests.s3_fixtures import free_port
from tests.server.runs.conftest import example_config


@pytest.fixture
def sqlite_client(sqlite_url: str, tmp_path: Path) -> Any:
    from server.app import create_app

    app = create_app(make_settings(sqlite_url, tmp_path / "bucket"), migrate=True)
    with TestClient(app) as client:
        yield client
    app.state.engine.dispose()


def _response_schema(schema: dict[str, Any], path: str, method: str, status: str) -> Any:
    return schema["paths"][path][method]["responses"][status]["content"]["application/json"][
        "schema"
    ]


def test_validation_error_body_is_the_documented_one(sqlite_client: TestClient) -> None:
    schema = sqlite_client.get("/openapi.json").json()
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    assert _response_schema(schema, "/api/v1/runs", "get", "422") == {
        "$ref": "#/components/schemas/ErrorBody"
    }
    headers = {"Authorization": f"Bearer {mint_token(sqlite_client.app, 'admin')}"}
    response = sqlite_client.get("/api/v1/runs?limit=0", headers=headers)
    assert response.status_code == 422
    body = ErrorBody.model_validate(response.json())
    assert body.errors is not None
    assert [e.field for e in body.errors] == ["query.limit"]


def test_app_errors_are_documented_on_token_operations(sqlite_client: TestClient) -> None:
    schema = sqlite_client.get("/openapi.json").json()
    ref = {"$ref": "#/components/schemas/ErrorBody"}
    for status in ("400", "401", "403", "404", "409", "413", "422"):
        assert _response_schema(schema, "/api/v1/runs/{run_id}", "get", status) == ref
    assert "401" not in schema["paths"]["/healthz"]["get"]["responses"]
    # An operation's own error model wins (the signed blob URLs answer BlobError).
    blob_403 = _response_schema(schema, "/blobs/{key}", "get", "403")
    assert blob_403 == {"$ref": "#/components/schemas/BlobError"}

    missing = sqlite_client.get("/api/v1/runs/00000000-0000-0000-0000-000000000000")
    assert missing.status_code == 401
    ErrorBody.model_validate(missing.json())
    headers = {"Authorization": f"Bearer {mint_token(sqlite_client.app, 'admin')}"}
    unknown = sqlite_client.get(
        "/api/v1/runs/00000000-0000-0000-0000-000000000000", headers=headers
    )
    assert unknown.status_code == 404
    assert ErrorBody.model_validate(unknown.json()).detail


def test_an_unreachable_bucket_is_503_not_500(pg_url: str, tmp_path: Path) -> None:
    """The store failing is an outage: clients get 503 + Retry-After and back off."""
    from server.app import create_app
    from server.config import S3Settings

    port = free_port()  # nothing listens on it

    s3 = S3Settings(
        endpoint_url=f"http://127.0.0.1:{port}",
        path_style=True,
        access_key_id="x",
        secret_access_key="y",
    )
    settings = make_settings(pg_url, tmp_path / "unused").model_copy(
        update={"bucket_url": "s3://unreachable-bucket", "s3": s3}
    )
    app = create_app(settings, migrate=True)
    admin = {"Authorization": f"Bearer {mint_token(app, 'admin')}"}
    config = example_config()
    with TestClient(app) as client:
        created = client.post("/api/v1/runs", json=config, headers=admin).json()
        run_id, learner = (
            created["run"]["id"],
            {"Authorization": f"Bearer {created['learner_token']}"},
        )
        attach = client.post(
            f"/api/v1/runs/{run_id}/learner/attach",
            json={"tokenizer_fingerprint": "fp"},
            headers=learner,
        ).json()
        files = [
            {"name": "adapter_model.safetensors", "size": 4, "sha256": "0" * 64, "kind": "adapter"}
        ]
        resp = client.post(
            f"/api/v1/runs/{run_id}/uploads",
            json={"fencing": attach["fencing"], "version": 1, "files": files},
            headers=learner,
        )
    app.state.engine.dispose()
    assert resp.status_code == 503, resp.text
    assert resp.headers["Retry-After"] == "5"
    assert "object store unavailable" in resp.json()["detail"]
    assert resp.json()["code"] == "store_unavailable"


def test_a_restarted_database_is_a_503_then_recovers(
    pg_url: str, client: TestClient, admin_headers: dict[str, str]
) -> None:
    """Pooled connections are not pinged per request: when the database drops them, the one
    request that meets a dead connection answers 503 + Retry-After (not a 500), and the next
    request runs on a fresh pool."""
    from tests.conftest import terminate_other_backends

    headers = admin_headers
    assert client.get("/api/v1/runs", headers=headers).status_code == 200
    assert terminate_other_backends(pg_url) >= 1
    failed = client.get("/api/v1/runs", headers=headers)
    assert failed.status_code == 503
    assert failed.headers["Retry-After"] == "1"
    assert "database unavailable" in failed.json()["detail"]
    assert failed.json()["code"] == "database_unavailable"
    assert client.get("/api/v1/runs", headers=headers).status_code == 200
