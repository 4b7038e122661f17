"""`asyncgrpo server --workers 2` on Postgres, as docs/guides/configuration.md, "Production
(Postgres)" runs it: the admin token is printed once (not once per process), `/metrics` keeps
each process's worker call counter apart, and a second start on another bucket refuses with
both buckets named."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import TEST_SECRET

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]
ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _env(database_url: str, bucket: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCGRPO_")}
    env.update(
        {
            "ASYNCGRPO_DATABASE_URL": database_url,
            "ASYNCGRPO_BUCKET_URL": str(bucket),
            "ASYNCGRPO_SECURITY__SECRET_KEY": TEST_SECRET,
            "ASYNCGRPO_JOBS__MODE": "celery",
            "ASYNCGRPO_DATABASE_POOL_SIZE": "2",
            "ASYNCGRPO_DATABASE_ASYNC_POOL_SIZE": "2",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def _server(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "asyncgrpo.cli", "server", *args],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _worker_calls(text: str) -> dict[str, float]:
    """pid -> acquire count, from one scrape."""
    return {
        s.labels["pid"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "asyncgrpo_worker_calls_total" and s.labels["call"] == "acquire"
    }


def test_two_processes_one_admin_token_per_process_counters_and_one_bucket(
    pg_url: str, tmp_path: Path
) -> None:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "server.log"
    proc = _server(["--port", str(port), "--workers", "2"], _env(pg_url, tmp_path / "b"), log)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.3)
        time.sleep(2)  # both processes past their startup
        output = log.read_text()
        assert output.count("admin token (shown once") == 1, output
        admin_token = next(w for w in output.split() if w.startswith("agr_adm_"))

        headers = {"Authorization": f"Bearer {admin_token}"}
        registration = httpx.post(
            f"{base}/api/v1/registration-tokens", json={"max_uses": 1}, headers=headers
        ).json()["token"]
        worker = httpx.post(
            f"{base}/api/v1/workers/register",
            json={"name": "w", "models": ["m"]},
            headers={"Authorization": f"Bearer {registration}"},
        ).json()
        worker_headers = {"Authorization": f"Bearer {worker['token']}"}
        seen: dict[str, list[float]] = {}
        with httpx.Client(base_url=base) as client:  # new connections: either process answers
            for _ in range(30):
                client.post("/api/v1/leases/acquire", json={}, headers=worker_headers)
                for pid, value in _worker_calls(client.get("/metrics").text).items():
                    seen.setdefault(pid, []).append(value)
        assert seen, "no worker call counted"
        for values in seen.values():  # each process's series only grows: no false resets
            assert values == sorted(values), seen
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)

    refused = subprocess.run(
        [sys.executable, "-m", "asyncgrpo.cli", "server", "--port", str(_free_port())],
        cwd=ROOT,
        env=_env(pg_url, tmp_path / "another"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"the database expects the bucket {tmp_path / 'b'}" in refused.stderr
    assert f"this process has {tmp_path / 'another'}" in refused.stderr
    assert "Traceback" not in refused.stderr
