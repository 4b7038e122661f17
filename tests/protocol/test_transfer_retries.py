"""A presigned transfer's tries (protocol/transfer.py) on the one retry policy
(protocol/retrying.py): transient answers are retried up to `attempts` tries, with waits of at
most 0.25 s, 0.5 s, 1 s… (capped at 4 s); another refusal is not retried. Against a real HTTP
server that answers the statuses the test scripts."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import protocol.transfer as transfer
from protocol.storage import PresignedPut
from protocol.transfer import TransferError, download_url, upload_presigned
from tests.s3_fixtures import free_port

# integration: an HTTP server on 127.0.0.1
pytestmark = pytest.mark.integration

BODY = b"batch bytes"


class Scripted(ThreadingHTTPServer):
    """Answers each request with the next scripted status (200 once the script is over)."""

    def __init__(self, statuses: list[int]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.statuses = statuses
        self.requests: list[str] = []


class _Handler(BaseHTTPRequestHandler):
    server: Scripted

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.server.requests.append(self.command)
        status = self.server.statuses.pop(0) if self.server.statuses else 200
        body = BODY if self.command == "GET" and status == 200 else b""
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = _answer

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The waits between tries, recorded instead of slept (the test is about which they are)."""
    recorded: list[float] = []
    monkeypatch.setattr(transfer.time, "sleep", recorded.append)
    return recorded


@contextmanager
def _serving(statuses: list[int]) -> Iterator[Scripted]:
    server = Scripted(statuses)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _url(server: Scripted) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/key"


def _within_the_policy(waits: list[float]) -> None:
    for n, wait in enumerate(waits, start=1):
        assert 0 <= wait <= min(transfer.RETRY_CAP_S, transfer.RETRY_BASE_S * 2 ** (n - 1))


def test_an_upload_retries_transient_answers_then_lands(waits: list[float]) -> None:
    with _serving([503, 429]) as server:
        upload_presigned(PresignedPut(_url(server), {}), BODY)
        assert server.requests == ["PUT"] * 3
    assert len(waits) == 2
    _within_the_policy(waits)


def test_a_download_gives_up_after_its_attempts(tmp_path: Path, waits: list[float]) -> None:
    with _serving([502] * 5) as server:
        with pytest.raises(TransferError) as refused:
            download_url(_url(server), tmp_path / "f", None, attempts=4)
        assert refused.value.status_code == 502
        assert server.requests == ["GET"] * 4
    assert len(waits) == 3
    _within_the_policy(waits)
    assert not (tmp_path / "f").exists()


def test_a_refusal_is_not_retried(tmp_path: Path, waits: list[float]) -> None:
    with _serving([403]) as server:
        with pytest.raises(TransferError) as refused:
            download_url(_url(server), tmp_path / "f", None)
        assert refused.value.status_code == 403
        assert server.requests == ["GET"]
    assert waits == []


def test_an_unreachable_host_is_a_transfer_error_after_its_attempts(
    tmp_path: Path, waits: list[float]
) -> None:
    url = f"http://127.0.0.1:{free_port()}/key"  # nothing listens there
    with pytest.raises(TransferError, match="transfer failed"):
        download_url(url, tmp_path / "f", None, attempts=3)
    assert len(waits) == 2
    _within_the_policy(waits)
