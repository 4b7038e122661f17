"""The bucket at start and while the server runs (server/bucket.py): a server without its bucket
exits saying how to create it (or creates it when ASYNCGRPO_S3__CREATE_BUCKET allows), GET
/readyz reports the database and the bucket, and a bucket that comes back is recorded without a
restart. `asyncgrpo jobs` and the Celery app started directly make the same check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine

from server.app import create_app
from server.config import S3Settings, Settings
from server.db import make_sessionmaker
from server.installation import MARKER_KEY
from tests.conftest import TEST_SECRET, make_settings
from tests.harness.broker import broker_url
from tests.s3_fixtures import S3Endpoint, free_port

ROOT = Path(__file__).resolve().parents[2]
CHECK_S = 0.2  # bucket_check_interval_s of these tests


def _s3(url: str, endpoint: S3Endpoint, **extra: Any) -> S3Settings:
    return S3Settings(
        endpoint_url=url,
        path_style=True,
        access_key_id=endpoint.access_key_id,
        secret_access_key=endpoint.secret_access_key,
        **extra,
    )


def _on_s3(database_url: str, tmp_path: Path, bucket: str, s3: S3Settings) -> Settings:
    return make_settings(database_url, tmp_path / "unused").model_copy(
        update={"bucket_url": f"s3://{bucket}/team", "s3": s3, "bucket_check_interval_s": CHECK_S}
    )


def _env(settings: Settings) -> dict[str, str]:
    """The settings as the environment of an `asyncgrpo` process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCGRPO_")}
    env.update(
        {
            "ASYNCGRPO_DATABASE_URL": settings.database_url,
            "ASYNCGRPO_BUCKET_URL": settings.bucket_url,
            "ASYNCGRPO_SECURITY__SECRET_KEY": TEST_SECRET,
            "ASYNCGRPO_PRINT_ADMIN_TOKEN": "false",
            "ASYNCGRPO_S3__ENDPOINT_URL": str(settings.s3.endpoint_url),
            "ASYNCGRPO_S3__PATH_STYLE": "true",
            "ASYNCGRPO_S3__ACCESS_KEY_ID": str(settings.s3.access_key_id),
            "ASYNCGRPO_S3__SECRET_ACCESS_KEY": str(settings.s3.secret_access_key),
            "ASYNCGRPO_JOBS__BROKER_URL": broker_url(),
        }
    )
    return env


def _wait_for(check: Callable[[], Any], what: str, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def missing_bucket() -> str:
    return f"missing-{uuid.uuid4().hex[:12]}"


def test_a_server_without_its_bucket_exits_naming_it_and_how_to_create_it(
    db_url: str, tmp_path: Path, moto_endpoint: S3Endpoint, missing_bucket: str
) -> None:
    settings = _on_s3(db_url, tmp_path, missing_bucket, _s3(moto_endpoint.url, moto_endpoint))
    out = subprocess.run(
        [sys.executable, "-m", "asyncgrpo.cli", "server", "--port", str(free_port())],
        cwd=tmp_path,  # the embedded mode's files
        env={**_env(settings), "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, out.stderr
    assert f"the bucket {missing_bucket} (s3://{missing_bucket}/team)" in errors[0]
    assert f"at {moto_endpoint.url} does not exist" in errors[0]
    assert f"aws s3 mb s3://{missing_bucket} --endpoint-url {moto_endpoint.url}" in errors[0]
    assert "ASYNCGRPO_S3__CREATE_BUCKET=true" in errors[0]
    assert "Traceback" not in out.stderr
    buckets = {b["Name"] for b in moto_endpoint.client().list_buckets()["Buckets"]}
    assert missing_bucket not in buckets  # nothing created without the setting


def test_create_bucket_lets_the_server_create_it_and_record_it(
    db_url: str, tmp_path: Path, moto_endpoint: S3Endpoint, missing_bucket: str
) -> None:
    s3 = _s3(moto_endpoint.url, moto_endpoint, create_bucket=True)
    app = create_app(_on_s3(db_url, tmp_path, missing_bucket, s3), migrate=True)
    try:
        with TestClient(app) as client:
            assert client.get("/readyz").json() == {
                "status": "ready",
                "database": "ok",
                "bucket": "ok",
            }
    finally:
        app.state.engine.dispose()
    marker = moto_endpoint.client().get_object(Bucket=missing_bucket, Key=f"team/{MARKER_KEY}")
    assert uuid.UUID(json.loads(marker["Body"].read())["database_id"])


def test_a_local_folder_bucket_is_created(db_url: str, tmp_path: Path) -> None:
    folder = tmp_path / "not" / "yet" / "bucket"
    app = create_app(make_settings(db_url, folder), migrate=True)
    try:
        with TestClient(app) as client:
            assert client.get("/readyz").status_code == 200
    finally:
        app.state.engine.dispose()
    assert (folder / MARKER_KEY).is_file()


@pytest.fixture
def s3_app(
    db_url: str, tmp_path: Path, moto_endpoint: S3Endpoint, bucket_proxy: Any, s3_bucket: str
) -> Iterator[Callable[[], TestClient]]:
    """An app on this test's bucket, reached through the proxy (cut it to make it unreachable)."""
    apps = []

    def make() -> TestClient:
        settings = _on_s3(db_url, tmp_path, s3_bucket, _s3(bucket_proxy.url, moto_endpoint))
        app = create_app(settings, migrate=True)
        apps.append(app)
        return TestClient(app)

    yield make
    for app in apps:
        app.state.engine.dispose()


def _installation(app: Any) -> Any:
    from server.db import transaction
    from server.models import Installation

    with transaction(app.state.sessionmaker) as session:
        return session.get(Installation, 1)


def test_a_bucket_unreachable_at_start_is_recorded_once_it_is_back_without_a_restart(
    s3_app: Callable[[], TestClient],
    bucket_proxy: Any,
    moto_endpoint: S3Endpoint,
    s3_bucket: str,
) -> None:
    bucket_proxy.cut()
    with s3_app() as client:
        not_ready = client.get("/readyz")
        assert not_ready.status_code == 503
        body = not_ready.json()
        assert body["code"] == "not_ready"
        assert body["database"] == "ok"
        assert body["bucket"].startswith(f"cannot reach the bucket {s3_bucket}")
        assert "bucket" in body["detail"] and "database" not in body["detail"]
        assert client.get("/healthz").status_code == 200  # liveness: the process is up
        assert _installation(client.app) is None  # nothing recorded: the bucket was not checked

        bucket_proxy.restore()
        _wait_for(lambda: client.get("/readyz").status_code == 200, "the bucket to be ready", 90)
        recorded = _installation(client.app)
        assert recorded is not None and recorded.bucket_url == f"s3://{s3_bucket}/team"
        marker = moto_endpoint.client().get_object(Bucket=s3_bucket, Key=f"team/{MARKER_KEY}")
        assert json.loads(marker["Body"].read())["database_id"] == str(recorded.database_id)


def test_a_bucket_deleted_while_running_is_not_ready_and_marked_again_when_recreated(
    s3_app: Callable[[], TestClient], moto_endpoint: S3Endpoint, s3_bucket: str
) -> None:
    s3 = moto_endpoint.client()
    with s3_app() as client:
        assert client.get("/readyz").status_code == 200
        database_id = str(_installation(client.app).database_id)
        for item in s3.list_objects_v2(Bucket=s3_bucket).get("Contents", []):
            s3.delete_object(Bucket=s3_bucket, Key=item["Key"])
        s3.delete_bucket(Bucket=s3_bucket)

        gone = _wait_for(
            lambda: (r := client.get("/readyz")).status_code == 503 and r, "the bucket to go"
        )
        assert "does not exist" in gone.json()["bucket"]
        s3.create_bucket(Bucket=s3_bucket)
        _wait_for(lambda: client.get("/readyz").status_code == 200, "the bucket to be back")
        marker = s3.get_object(Bucket=s3_bucket, Key=f"team/{MARKER_KEY}")
        assert json.loads(marker["Body"].read())["database_id"] == database_id


def test_readyz_names_the_database_when_it_cannot_be_reached(db_url: str, tmp_path: Path) -> None:
    app = create_app(make_settings(db_url, tmp_path / "bucket"), migrate=True)
    try:
        with TestClient(app) as client:
            assert client.get("/readyz").status_code == 200
            nowhere = create_engine(f"postgresql+psycopg://nobody@127.0.0.1:{free_port()}/none")
            app.state.sessionmaker = make_sessionmaker(nowhere)
            answer = client.get("/readyz")
            assert answer.status_code == 503
            body = answer.json()
            assert body["database"].startswith("unavailable (OperationalError")
            # no token on /readyz: the driver's words (address, port, user) stay in the log
            assert "nobody" not in answer.text and "127.0.0.1" not in answer.text
            assert body["bucket"] == "ok"
            assert body["detail"] == "not ready: database"
            nowhere.dispose()
    finally:
        app.state.engine.dispose()


def _run(argv: list[str], settings: Settings, timeout_s: float = 90) -> Any:
    return subprocess.run(
        argv,
        cwd=ROOT,
        env=_env(settings),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def test_jobs_name_a_missing_bucket_not_a_server_that_never_started(
    pg_url: str, tmp_path: Path, moto_endpoint: S3Endpoint, missing_bucket: str
) -> None:
    settings = _on_s3(pg_url, tmp_path, missing_bucket, _s3(moto_endpoint.url, moto_endpoint))
    out = _run([sys.executable, "-m", "asyncgrpo.cli", "jobs", "--no-beat"], settings)
    assert out.returncode == 2, out.stderr
    assert f"the bucket {missing_bucket} (s3://{missing_bucket}/team)" in out.stderr
    assert "does not exist" in out.stderr
    assert "no server has" not in out.stderr
    assert "Traceback" not in out.stderr


def test_the_celery_app_started_directly_checks_the_bucket(
    pg_url: str, tmp_path: Path, moto_endpoint: S3Endpoint, missing_bucket: str
) -> None:
    settings = _on_s3(pg_url, tmp_path, missing_bucket, _s3(moto_endpoint.url, moto_endpoint))
    celery = str(Path(sys.executable).parent / "celery")
    for command in (["worker", "--pool", "solo"], ["beat", f"--schedule={tmp_path / 's'}"]):
        out = _run([celery, "-A", "server.jobs.celery_app", *command], settings)
        assert out.returncode != 0, (command, out.stderr)
        errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, (command, out.stderr)
        assert f"the bucket {missing_bucket} (s3://{missing_bucket}/team)" in errors[0]
        assert "does not exist" in errors[0]
