"""The learner's transfers through a bucket outage: moto S3 behind a TCP proxy that is cut and
restored; the control plane (in-process, real Postgres) reaches the same bucket only through
the proxy, so its own bucket calls fail during the outage too."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from learner import transfers
from learner.transfers import (
    BucketRefused,
    ObjectMissing,
    Retrier,
    transient_api,
    upload_version_files,
)
from protocol import schemas_learner as sl
from protocol.client import AsyncGrpoClient
from tests.e2e.tcp_proxy import TcpProxy
from tests.harness.live_app import proxied_settings
from tests.s3_fixtures import S3Endpoint
from tests.server.learner.support import FP, make_run

pytestmark = pytest.mark.timeout(120)


class Gone(Exception):
    pass


def _restore_after(proxy: TcpProxy, seconds: float) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(seconds), proxy.restore()), daemon=True)
    thread.start()
    return thread


def _fast_retrier(alive: Any = lambda: None) -> Retrier:
    return Retrier(alive, base_s=0.05, cap_s=0.3)


@pytest.fixture
def app(pg_url: str, tmp_path: Path, proxy: TcpProxy, moto_endpoint: S3Endpoint, s3_bucket: str):  # type: ignore[no-untyped-def]
    from server.app import create_app

    settings = proxied_settings(pg_url, tmp_path, proxy, moto_endpoint, s3_bucket)
    application = create_app(settings, migrate=True)
    yield application
    application.state.engine.dispose()


@pytest.fixture
def learner(app: Any) -> Iterator[tuple[AsyncGrpoClient, str, int]]:
    run = make_run(app)
    http = TestClient(app, raise_server_exceptions=False)  # a bucket failure is a 500
    client = AsyncGrpoClient("http://testserver", run.token, http=http, max_retries=0)
    attach = client.learner_attach(str(run.id), FP)
    yield client, str(run.id), attach.fencing
    http.close()


NAMES = [
    ("adapter", "adapter_model.safetensors"),
    ("adapter", "adapter_config.json"),
    ("checkpoint", "optimizer.safetensors"),
]


def _files(tmp: Path) -> tuple[list[sl.UploadFile], dict[tuple[str, str], Path]]:
    uploads, paths = [], {}
    for i, (kind, name) in enumerate(NAMES):
        path = tmp / kind / name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(uuid.uuid4().bytes * (100 + i))
        data = path.read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        uploads.append(sl.UploadFile(name=path.name, size=len(data), sha256=sha, kind=kind))  # type: ignore[arg-type]
        paths[(kind, path.name)] = path
    return uploads, paths


def _bucket_bytes(s3: S3Endpoint, bucket: str, key: str) -> bytes:
    return bytes(s3.client().get_object(Bucket=bucket, Key=key)["Body"].read())


def _publish(client: AsyncGrpoClient, run_id: str, fencing: int, files: Any, keys: Any) -> int:
    def published(kind: str) -> list[sl.PublishedFile]:
        return [
            sl.PublishedFile(name=f.name, key=keys[(f.kind, f.name)], sha256=f.sha256, size=f.size)
            for f in files
            if f.kind == kind
        ]

    body = sl.PublishRequest(
        fencing=fencing,
        version=1,
        files=published("adapter"),
        checkpoint_files=published("checkpoint"),
        learner_step=1,
        metrics={},
        consumed_batch_ids=[],
        final=False,
    )
    return client.publish_adapter(run_id, body).version


def test_download_waits_out_an_outage(
    tmp_path: Path,
    proxy: TcpProxy,
    moto_endpoint: S3Endpoint,
    s3_bucket: str,
    app: Any,
) -> None:
    data = b"batch bytes " * 1000
    moto_endpoint.client().put_object(Bucket=s3_bucket, Key="runs/x/batch.parquet", Body=data)
    url = app.state.store.presign_get("runs/x/batch.parquet", 600)
    proxy.cut()
    _restore_after(proxy, 1.5)
    retrier = _fast_retrier()
    dest = tmp_path / "batch.parquet"
    assert retrier.download(url, dest, hashlib.sha256(data).hexdigest()) == len(data)
    assert dest.read_bytes() == data
    assert retrier.retries >= 1


def test_download_retries_stop_when_the_lease_is_lost(
    tmp_path: Path,
    proxy: TcpProxy,
    app: Any,
) -> None:
    url = app.state.store.presign_get("runs/x/none.parquet", 600)
    proxy.cut()
    checks = []

    def alive() -> None:
        checks.append(1)
        if len(checks) > 3:
            raise Gone

    with pytest.raises(Gone):
        _fast_retrier(alive).download(url, tmp_path / "b", None)
    assert len(checks) == 4


def test_download_refused_by_the_bucket_is_not_retried(tmp_path: Path, app: Any) -> None:
    url = app.state.store.presign_get("runs/x/missing.parquet", 600)  # 404
    retrier = _fast_retrier()
    with pytest.raises(ObjectMissing):
        retrier.download(url, tmp_path / "b", None)
    assert retrier.retries == 0
    # An expired or bad signature (403; moto does not check expiry, so a bucket stand-in that
    # answers 403 to everything): re-attach for fresh URLs, not reject the batch.
    with _bucket_answering(403) as base, pytest.raises(BucketRefused) as refused:
        retrier.download(f"{base}/runs/x/batch.parquet?X-Amz-Expires=1", tmp_path / "b", None)
    assert not isinstance(refused.value, ObjectMissing)
    assert retrier.retries == 0


@contextlib.contextmanager
def _bucket_answering(status: int) -> Iterator[str]:
    class Refuse(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server hook's name
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join(5)


def test_uploads_survive_an_outage_and_publish(
    tmp_path: Path,
    proxy: TcpProxy,
    moto_endpoint: S3Endpoint,
    s3_bucket: str,
    learner: tuple[AsyncGrpoClient, str, int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bucket goes away between the upload URLs and the first PUT: the PUT fails, fresh URLs
    are asked for (the server's own bucket call answers 500 until the bucket is back), and
    every file lands."""
    real = transfers._upload_presigned
    puts: list[str] = []

    def cut_before_first_put(put: Any, source: Any, **kwargs: Any) -> None:
        if not puts:
            proxy.cut()
            _restore_after(proxy, 2.0)
        puts.append(put.url)
        real(put, source, **kwargs)

    monkeypatch.setattr(transfers, "_upload_presigned", cut_before_first_put)
    client, run_id, fencing = learner
    files, paths = _files(tmp_path)
    request = sl.UploadsRequest(fencing=fencing, version=1, files=files)
    retrier = _fast_retrier()
    keys = upload_version_files(retrier, client, run_id, request, paths)
    assert retrier.retries >= 2  # the failed PUT and at least one failed uploads call
    assert len(puts) == len(files) + 1
    for f in files:
        assert (
            _bucket_bytes(moto_endpoint, s3_bucket, keys[(f.kind, f.name)])
            == paths[(f.kind, f.name)].read_bytes()
        )
    assert _publish(client, run_id, fencing, files, keys) == 1


def test_a_put_that_landed_before_its_retry_is_sent_again(
    tmp_path: Path,
    moto_endpoint: S3Endpoint,
    s3_bucket: str,
    learner: tuple[AsyncGrpoClient, str, int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first PUT lands but its answer is lost, so the retry of the conditional PUT gets a
    real 412 from the bucket: fresh URLs are requested and our bytes sent again."""
    real = transfers._upload_presigned
    calls: list[str] = []

    def landed_then_retried(put: Any, source: Any, **kwargs: Any) -> None:
        calls.append(put.url)
        if len(calls) == 1:
            real(put, source, **kwargs)  # lands; the "retry" below answers 412 (ObjectExists)
        real(put, source, **kwargs)

    monkeypatch.setattr(transfers, "_upload_presigned", landed_then_retried)
    client, run_id, fencing = learner
    files, paths = _files(tmp_path)
    request = sl.UploadsRequest(fencing=fencing, version=1, files=files)
    retrier = _fast_retrier()
    keys = upload_version_files(retrier, client, run_id, request, paths)
    assert retrier.retries == 1
    assert len(calls) == len(files) + 1  # file 0 twice (the second with a fresh URL)
    first_key = calls[0].split("?", 1)[0]
    assert first_key.endswith("adapter_model.safetensors") and calls[1].startswith(first_key)
    for f in files:
        assert (
            _bucket_bytes(moto_endpoint, s3_bucket, keys[(f.kind, f.name)])
            == paths[(f.kind, f.name)].read_bytes()
        )
    assert _publish(client, run_id, fencing, files, keys) == 1


def test_a_keyed_call_goes_on_after_the_lease_ends_until_the_session_stops() -> None:
    """A lost answer to a keyed call (the final publish, whose run completion ended the lease)
    is fetched again after the heartbeat's 409; an unkeyed call stops there; a closed session
    stops both."""
    stopping = threading.Event()
    attempts: list[int] = []

    def lease_gone() -> None:
        raise Gone("heartbeat answered 409")

    def session_open() -> None:
        if stopping.is_set():
            raise Gone("the session is stopping")

    def answer_lost_twice() -> str:
        attempts.append(1)
        if len(attempts) <= 2:
            raise httpx.ReadTimeout("the answer was lost")
        return "the stored answer"

    retrier = Retrier(lease_gone, session_open=session_open, base_s=0.001, cap_s=0.002)
    assert retrier.call_keyed("publish", answer_lost_twice, transient_api) == "the stored answer"
    assert len(attempts) == 3
    with pytest.raises(Gone, match="heartbeat"):
        retrier.call("claim", answer_lost_twice, transient_api)
    assert len(attempts) == 3  # not sent: the lease check comes before each attempt
    stopping.set()
    with pytest.raises(Gone, match="stopping"):
        retrier.call_keyed("publish", answer_lost_twice, transient_api)
    assert len(attempts) == 3
