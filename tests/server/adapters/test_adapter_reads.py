"""Admin adapter reads: versions list, `{version}` as a number, `latest` or `final`, and
short-lived download URLs from the app's real local store."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from protocol.run_config import RunConfig
from server.models import AdapterVersion
from server.runs import service as runs
from tests.conftest import mint_token

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "runs" / "arithmetic.json"


@pytest.fixture
def adapters_app(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    from server.app import create_app
    from tests.conftest import make_settings

    application = create_app(make_settings(db_url, tmp_path / "bucket"), migrate=True)
    yield application
    application.state.engine.dispose()


@pytest.fixture
def client(adapters_app) -> Iterator[TestClient]:  # type: ignore[no-untyped-def]
    with TestClient(adapters_app) as test_client:
        yield test_client


@pytest.fixture
def admin(adapters_app) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {"Authorization": f"Bearer {mint_token(adapters_app, 'admin')}"}


def make_run(app: Any) -> uuid.UUID:
    from server.db import transaction

    config = RunConfig.model_validate(json.loads(EXAMPLE.read_text()))
    with transaction(app.state.sessionmaker) as session:
        run, _token = runs.create_run(session, config)
        return run.id


def publish(
    app: Any, run_id: uuid.UUID, version: int, *, final: bool = False, deleted: bool = False
) -> dict[str, bytes]:
    """Upload files to the app's store and insert the AdapterVersion row directly."""
    from server.db import transaction

    payloads = {
        "adapter_model.safetensors": f"weights of v{version}".encode() * 100,
        "adapter_config.json": json.dumps({"r": 16, "version": version}).encode(),
    }
    files = {}
    for name, data in payloads.items():
        key = f"runs/{run_id}/adapters/v{version:06d}/{name}"
        app.state.store.put_bytes(key, data, if_none_match=True)
        files[name] = {"key": key, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    with transaction(app.state.sessionmaker) as session:
        session.add(
            AdapterVersion(
                run_id=run_id,
                version=version,
                files=files,
                checkpoint_files={},
                sha256=files["adapter_model.safetensors"]["sha256"],
                bytes=sum(len(d) for d in payloads.values()),
                learner_step=version * 4,
                metrics={"reward_mean": version / 10},
                final=final,
                deleted=deleted,
            )
        )
    return payloads


def test_list_versions(adapters_app, client, admin) -> None:  # type: ignore[no-untyped-def]
    run_id = make_run(adapters_app)
    assert client.get(f"/api/v1/runs/{run_id}/adapters", headers=admin).json() == []
    published = {v: publish(adapters_app, run_id, v, final=(v == 3)) for v in (1, 2, 3)}
    listed = client.get(f"/api/v1/runs/{run_id}/adapters", headers=admin).json()
    assert [v["version"] for v in listed] == [1, 2, 3]
    assert [v["final"] for v in listed] == [False, False, True]
    for item in listed:
        payloads = published[item["version"]]
        assert item["bytes"] == sum(len(d) for d in payloads.values())
        assert item["learner_step"] == item["version"] * 4
        assert item["created_at"]
        assert {f["name"]: (f["sha256"], f["size"]) for f in item["files"]} == {
            name: (hashlib.sha256(d).hexdigest(), len(d)) for name, d in payloads.items()
        }
        assert all("url" not in f for f in item["files"])


def _download_all(client: TestClient, body: dict[str, Any]) -> dict[str, bytes]:
    out = {}
    for f in body["files"]:
        resp = client.get(f["url"])  # no admin header: the URL itself is the credential
        assert resp.status_code == 200, resp.text
        assert hashlib.sha256(resp.content).hexdigest() == f["sha256"]
        out[f["name"]] = resp.content
    return out


def test_version_latest_and_final_with_download_urls(adapters_app, client, admin) -> None:  # type: ignore[no-untyped-def]
    run_id = make_run(adapters_app)
    url = f"/api/v1/runs/{run_id}/adapters"
    for which in ("latest", "final", "1"):
        resp = client.get(f"{url}/{which}", headers=admin)
        assert resp.status_code == 404, which
        assert "no" in resp.json()["detail"] or "does not exist" in resp.json()["detail"]
    v1 = publish(adapters_app, run_id, 1)
    v2 = publish(adapters_app, run_id, 2)
    assert client.get(f"{url}/final", headers=admin).status_code == 404

    latest = client.get(f"{url}/latest", headers=admin).json()
    assert latest["version"] == 2 and latest["base_model"] == "smollm2-135m-instruct"
    assert 0 < latest["files"][0]["expires_in_s"] <= 900
    assert _download_all(client, latest) == v2
    assert _download_all(client, client.get(f"{url}/1", headers=admin).json()) == v1

    v3 = publish(adapters_app, run_id, 3, final=True)
    final = client.get(f"{url}/final", headers=admin).json()
    assert final["version"] == 3 and final["final"] is True
    assert _download_all(client, final) == v3
    assert client.get(f"{url}/latest", headers=admin).json()["version"] == 3


def test_missing_deleted_and_invalid_versions(adapters_app, client, admin) -> None:  # type: ignore[no-untyped-def]
    run_id = make_run(adapters_app)
    publish(adapters_app, run_id, 1, deleted=True)
    url = f"/api/v1/runs/{run_id}/adapters"
    zero = client.get(f"{url}/0", headers=admin)
    assert zero.status_code == 404 and "base model" in zero.json()["detail"]
    assert client.get(f"{url}/7", headers=admin).status_code == 404
    gone = client.get(f"{url}/1", headers=admin)
    assert gone.status_code == 410 and "deleted by retention" in gone.json()["detail"]
    for bad in ("newest", "-1", "1.5", "\u0661", "+1"):  # ASCII digits only (not "١")
        resp = client.get(f"{url}/{bad}", headers=admin)
        assert resp.status_code == 422, bad
        assert resp.json()["errors"][0]["field"] == "path.version"
    other = uuid.uuid4()
    assert client.get(f"/api/v1/runs/{other}/adapters", headers=admin).status_code == 404
    assert client.get(f"/api/v1/runs/{other}/adapters/latest", headers=admin).status_code == 404


def test_adapter_reads_are_admin_only(adapters_app, client) -> None:  # type: ignore[no-untyped-def]
    run_id = make_run(adapters_app)
    url = f"/api/v1/runs/{run_id}/adapters"
    assert client.get(url).status_code == 401
    worker = {
        "Authorization": f"Bearer {mint_token(adapters_app, 'worker', scope_id=uuid.uuid4())}"
    }
    assert client.get(url, headers=worker).status_code == 403
    assert client.get(f"{url}/latest", headers=worker).status_code == 403
