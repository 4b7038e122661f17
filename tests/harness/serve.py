"""Serve an app with uvicorn on 127.0.0.1 in a thread, for tests that need real HTTP; or run
`asyncgrpo server` in a process of its own, for tests that measure the server process."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn

from asyncgrpo.cluster import ManagedProcess, process_env
from tests.s3_fixtures import free_port

ROOT = Path(__file__).resolve().parents[2]


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


@contextmanager
def serve_in_process(
    database_url: str,
    bucket: Path,
    log: Path,
    start_timeout_s: float = 60.0,
    settings_env: Mapping[str, str] | None = None,
) -> Iterator[tuple[str, int]]:
    """`asyncgrpo server` in a process of its own (asyncgrpo.cluster.ManagedProcess: its own
    process group, dies with the test process) on the database and bucket given (made by the
    test's app: migrated, its bucket recorded); yields its base URL and pid. No background
    jobs run in it (celery mode), so what it holds is what requests hold. `settings_env`: more
    ASYNCGRPO_* settings for it (pool sizes, the worker calls' path)."""
    import httpx

    from tests.conftest import TEST_SECRET

    port = free_port()
    env = process_env(
        {
            "ASYNCGRPO_DATABASE_URL": database_url,
            "ASYNCGRPO_BUCKET_URL": str(bucket),
            "ASYNCGRPO_SECURITY__SECRET_KEY": TEST_SECRET,
            "ASYNCGRPO_JOBS__MODE": "celery",
            "ASYNCGRPO_PRINT_ADMIN_TOKEN": "false",
            **(settings_env or {}),
        }
    )
    argv = [sys.executable, "-m", "asyncgrpo.cli", "server", "--port", str(port)]
    server = ManagedProcess("server", argv, env, ROOT, log).start()
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout_s
        while not _answers(httpx, f"{base}/healthz"):
            assert server.alive(), server.log_text()
            assert time.monotonic() < deadline, server.log_text()
            time.sleep(0.2)
        yield base, server.pid
    finally:
        server.stop(grace_s=30)


def _answers(httpx: Any, url: str) -> bool:
    try:
        return bool(httpx.get(url, timeout=1).status_code == 200)
    except httpx.HTTPError:
        return False


def reset_peak_rss(pid: int) -> int:
    """Reset the process's peak resident size (VmHWM) to its current one; returns that, in
    bytes (Linux: writing 5 to clear_refs)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return _status_bytes(pid, "VmRSS")


def peak_rss(pid: int) -> int:
    """The process's peak resident size since the last reset, in bytes."""
    return _status_bytes(pid, "VmHWM")


def _status_bytes(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key} in /proc/{pid}/status")
