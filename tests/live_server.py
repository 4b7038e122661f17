"""Serve an app with uvicorn on 127.0.0.1 in a thread, for tests that need real HTTP."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from tests.s3_fixtures import free_port


@contextmanager
def serve_in_thread(
    app: Any, port: int | None = None, start_timeout_s: float = 20.0
) -> Iterator[str]:
    """Yields the base URL; stops the server and disposes the app's engine afterwards."""
    port = port or free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        app.state.engine.dispose()
