"""One database, one bucket (server/installation.py): the first server records its bucket and
marks it with the database's id; a server or `asyncgrpo jobs` on another bucket refuses to
start, naming both."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from server import installation
from server.app import create_app
from server.config import S3Settings
from server.installation import MARKER_KEY, BucketMismatch
from tests.conftest import TEST_SECRET, cloned_database, make_settings

ROOT = Path(__file__).resolve().parents[2]


def _start(settings: Any) -> None:
    """Start (and stop) a server process's app: its lifespan runs the check."""
    app = create_app(settings, migrate=True)
    try:
        with TestClient(app):
            pass
    finally:
        app.state.engine.dispose()


def test_a_server_on_another_bucket_refuses_and_the_same_bucket_starts(
    db_url: str, tmp_path: Path
) -> None:
    first = tmp_path / "bucket"
    _start(make_settings(db_url, first))
    marker = json.loads((first / MARKER_KEY).read_text())
    uuid.UUID(marker["database_id"])

    with pytest.raises(BucketMismatch) as refused:
        _start(make_settings(db_url, tmp_path / "other"))
    message = str(refused.value)
    assert f"the database expects the bucket {first}" in message
    assert f"this process has {tmp_path / 'other'}, which holds no marker" in message

    _start(make_settings(db_url, first))  # the same bucket: starts
    assert json.loads((first / MARKER_KEY).read_text()) == marker


def test_a_bucket_of_another_database_is_refused_and_nothing_is_recorded(
    pg_admin: Any, pg_template: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(installation, "SIBLING_WAIT_S", 0.3)
    bucket = tmp_path / "bucket"
    with (
        cloned_database(pg_admin, pg_template) as one,
        cloned_database(pg_admin, pg_template) as two,
    ):
        _start(make_settings(one, bucket))
        owner = json.loads((bucket / MARKER_KEY).read_text())["database_id"]
        with pytest.raises(BucketMismatch, match=re.escape(f"another database (id {owner},")):
            _start(make_settings(two, bucket))
        # the refused start claimed nothing: the second database starts on a bucket of its own
        _start(make_settings(two, tmp_path / "bucket-two"))
        assert (
            json.loads((tmp_path / "bucket-two" / MARKER_KEY).read_text())["database_id"] != owner
        )


def test_the_marker_lives_in_an_s3_bucket_too(
    pg_url: str, tmp_path: Path, moto_endpoint: Any, s3_bucket: str, s3_store: Any
) -> None:
    s3 = S3Settings(
        endpoint_url=moto_endpoint.url,
        path_style=True,
        access_key_id=moto_endpoint.access_key_id,
        secret_access_key=moto_endpoint.secret_access_key,
    )
    on_s3 = make_settings(pg_url, tmp_path / "unused").model_copy(
        update={"bucket_url": f"s3://{s3_bucket}/team", "s3": s3}
    )
    _start(on_s3)
    assert json.loads(s3_store.get_bytes(f"team/{MARKER_KEY}"))["database_id"]
    with pytest.raises(BucketMismatch, match=f"expects the bucket s3://{s3_bucket}/team"):
        _start(make_settings(pg_url, tmp_path / "bucket"))  # the default-like local folder
    _start(on_s3)


def _jobs(database_url: str, bucket: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCGRPO_")}
    env.update(
        {
            "ASYNCGRPO_DATABASE_URL": database_url,
            "ASYNCGRPO_BUCKET_URL": str(bucket),
            "ASYNCGRPO_SECURITY__SECRET_KEY": TEST_SECRET,
        }
    )
    return subprocess.run(
        [sys.executable, "-m", "asyncgrpo.cli", "jobs", "--no-beat"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_jobs_refuse_another_bucket_and_a_database_no_server_has_started(
    pg_url: str, tmp_path: Path
) -> None:
    (tmp_path / "bucket").mkdir()  # the folder exists, no server has recorded it
    out = _jobs(pg_url, tmp_path / "bucket")
    assert out.returncode == 2
    assert "no server has recorded its bucket on this database yet" in out.stderr

    _start(make_settings(pg_url, tmp_path / "bucket"))
    out = _jobs(pg_url, tmp_path / "bucket-of-jobs")
    assert out.returncode == 2, out.stderr
    assert f"the database expects the bucket {tmp_path / 'bucket'}" in out.stderr
    assert f"this process has {tmp_path / 'bucket-of-jobs'}" in out.stderr
    assert "Traceback" not in out.stderr


def test_jobs_on_the_database_bucket_pass_the_check(pg_url: str, tmp_path: Path) -> None:
    from protocol.storage_local import LocalStore
    from server.db import make_engine, make_sessionmaker
    from server.installation import bind_bucket

    bucket = tmp_path / "bucket"
    _start(make_settings(pg_url, bucket))
    engine = make_engine(pg_url)
    try:
        store = LocalStore(root=str(bucket), base_url="http://x/blobs", secret_key=TEST_SECRET)
        database_id = bind_bucket(make_sessionmaker(engine), store, str(bucket), first=False)
    finally:
        engine.dispose()
    assert str(database_id) == json.loads((bucket / MARKER_KEY).read_text())["database_id"]
