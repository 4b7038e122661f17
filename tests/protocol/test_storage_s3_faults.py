"""An S3 endpoint that fails mid-transfer: the store raises StoreError (the API's 503, the
datasets job's "bucket trouble": the upload stays pending, its file kept), not boto3's own
exceptions, which neither the API nor the job recognise as bucket errors."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from protocol.storage import StoreError
from protocol.storage_s3 import S3Store

pytestmark = pytest.mark.timeout(60)


class _Truncating(BaseHTTPRequestHandler):
    """Says an object has 1,000 bytes, then sends 10 of them and closes the connection."""

    protocol_version = "HTTP/1.1"

    def _headers(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "1000")
        self.send_header("ETag", '"0123456789abcdef0123456789abcdef"')
        self.send_header("Last-Modified", "Tue, 01 Dec 2026 00:00:00 GMT")
        self.send_header("Connection", "close")
        self.end_headers()

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
        self._headers()

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._headers()
        self.wfile.write(b"x" * 10)
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def truncating_endpoint() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Truncating)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_download_cut_short_every_try_is_a_store_error(
    truncating_endpoint: str, tmp_path: Path
) -> None:
    store = S3Store(
        "bucket",
        endpoint_url=truncating_endpoint,
        path_style=True,
        access_key_id="k",
        secret_access_key="s",
    )
    with pytest.raises(StoreError):
        store.download_file("datasets/x.parquet", tmp_path / "x.parquet")
    assert not (tmp_path / "x.parquet").exists()
