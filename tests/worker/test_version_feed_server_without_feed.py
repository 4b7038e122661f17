"""A server without the version feed (`GET /api/v1/versions`: older than the feed, so older
than error codes too) answers 404 with no `code`; the worker's feed then stops for good and
versions load when leases need them, as before codes existed. Against a real HTTP server that
answers every request as such a server's framework does."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from protocol.client import AsyncGrpoClient
from protocol.error_codes import ErrorCode
from worker.versions import VersionFeed

# integration: a server on 127.0.0.1
pytestmark = pytest.mark.integration

STOPS_WITHIN_S = 10.0


class _NoFeed(BaseHTTPRequestHandler):
    body: dict[str, Any] = {}

    def do_GET(self) -> None:
        self.server.requests += 1  # type: ignore[attr-defined]
        payload = json.dumps(self.body).encode()
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *_args: object) -> None:
        pass


@contextmanager
def _server(body: dict[str, Any]) -> Iterator[ThreadingHTTPServer]:
    handler = type("Handler", (_NoFeed,), {"body": body})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.requests = 0  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    "body",
    [
        {"detail": "Not Found"},  # a server older than error codes
        {"detail": "Not Found", "code": ErrorCode.route_not_found.value},
    ],
    ids=["no-code", "route_not_found"],
)
def test_the_feed_stops_when_the_server_has_none(body: dict[str, Any]) -> None:
    with _server(body) as server:
        client = AsyncGrpoClient(f"http://127.0.0.1:{server.server_address[1]}", "agr_wrk_x")
        feed = VersionFeed(
            client,
            loads=None,  # type: ignore[arg-type]  # never reached: nothing is fetched
            served_runs=set,
            wait_s=0.0,
            retry_max_s=0.2,
        )
        try:
            feed.start()
            feed._thread.join(STOPS_WITHIN_S)
            assert not feed._thread.is_alive(), "the feed kept polling a server without one"
            assert server.requests == 1  # type: ignore[attr-defined]
        finally:
            feed.stop()
            client.close()
