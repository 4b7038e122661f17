"""A worker's local state and its start: each worker keeps its state in a folder of its own
name, two worker processes on one token file are refused, a refused registration token ends the
start in one line before the model loads, and a rejoin from the token file says so. Real
`asyncgrpo worker` processes against the real server (tests/worker/harness.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from protocol.client import AsyncGrpoClient
from tests.harness.stack import LiveServer
from tests.s3_fixtures import free_port
from tests.worker.harness import REPO
from worker import credentials
from worker.config import STATE_ROOT, WorkerSettings


def test_each_worker_keeps_its_state_in_a_folder_of_its_own_name() -> None:
    one = WorkerSettings(server_url="http://s", name="gpu-1")
    two = WorkerSettings(server_url="http://s", name="gpu-2")
    assert one.state_dir == STATE_ROOT / "gpu-1"
    assert (one.token_file, one.adapter_cache_dir, one.work_dir) == (
        STATE_ROOT / "gpu-1" / "token.json",
        STATE_ROOT / "gpu-1" / "adapters",
        STATE_ROOT / "gpu-1" / "batches",
    )
    assert {one.token_file, one.adapter_cache_dir, one.work_dir}.isdisjoint(
        {two.token_file, two.adapter_cache_dir, two.work_dir}
    )
    # a name is one folder, never a path; an explicit file or folder wins
    odd = WorkerSettings(server_url="http://s", name="../a/b c")
    assert odd.state_dir == STATE_ROOT / ".._a_b_c"
    mine = WorkerSettings(server_url="http://s", name="x", state_dir=Path("/srv/w"))
    assert mine.token_file == Path("/srv/w/token.json")
    given = WorkerSettings(server_url="http://s", name="x", token_file=Path("/t.json"))
    assert (given.token_file, given.work_dir) == (Path("/t.json"), STATE_ROOT / "x" / "batches")


def _worker(tmp_path: Path, *args: str, model_cache: Path | None = None) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCGRPO_")}
    env["PYTHONPATH"] = str(REPO)
    env["ASYNCGRPO_WORKER_RETRY_MAX_S"] = "1"
    if model_cache is not None:
        env["ASYNCGRPO_MODEL_CACHE"] = str(model_cache)
    return subprocess.Popen(
        [sys.executable, "-m", "asyncgrpo.cli", "worker", "--threads", "1", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _stop(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


@pytest.mark.e2e  # two worker processes
def test_a_second_worker_process_on_the_same_token_file_is_refused(tmp_path: Path) -> None:
    token_file = tmp_path / "shared" / "token.json"
    # the first holds the token file while it retries a server that does not answer
    nowhere = f"http://127.0.0.1:{free_port()}"
    common = ["--server", nowhere, "--registration-token", "agr_reg_x", "--token-file"]
    first = _worker(tmp_path, *common, str(token_file), "--name", "one")
    try:
        pid_file = Path(f"{token_file}.pid")
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text().strip()):
            assert first.poll() is None, _stop(first)
            assert time.monotonic() < deadline, "the first worker never took the token file"
            time.sleep(0.1)
        second = _worker(tmp_path, *common, str(token_file), "--name", "two")
        out, _ = second.communicate(timeout=60)
        assert second.returncode == 2, out
        errors = [line for line in out.splitlines() if line.startswith("error:")]
        assert errors == [
            f"error: the token file {token_file} is in use by another worker process "
            f"(pid {first.pid}): give each worker its own --name (its state folder) or "
            "--token-file"
        ], out
        assert "Traceback" not in out
        assert first.poll() is None  # the holder is untouched
    finally:
        _stop(first)
    # once the holder has ended, the file is free again
    third = _worker(tmp_path, *common, str(token_file), "--name", "three")
    try:
        deadline = time.monotonic() + 60
        while pid_file.read_text().strip() != str(third.pid):
            assert third.poll() is None, _stop(third)
            assert time.monotonic() < deadline, "the token file was not free again"
            time.sleep(0.1)
    finally:
        _stop(third)


@pytest.fixture
def admin(server: LiveServer) -> Iterator[AsyncGrpoClient]:
    client = AsyncGrpoClient(server.url, server.admin_token)
    yield client
    client.close()


def _refused_tokens(server: LiveServer, admin: AsyncGrpoClient) -> dict[str, str]:
    used = admin.create_registration_token(max_uses=1)["token"]
    with AsyncGrpoClient(server.url) as anonymous:
        anonymous.register_worker(used, name="took-the-only-use")
    revoked = admin.create_registration_token(max_uses=5)
    httpx.post(
        f"{server.url}/api/v1/registration-tokens/{revoked['id']}/revoke",
        headers={"Authorization": f"Bearer {admin.token}"},
    ).raise_for_status()
    return {
        "registration token has reached its use limit": used,
        "token revoked": revoked["token"],
        "invalid token": "agr_reg_" + uuid.uuid4().hex,
    }


def test_a_refused_registration_token_ends_the_start_in_one_line_before_the_model_loads(
    server: LiveServer, admin: AsyncGrpoClient, tmp_path: Path
) -> None:
    model_cache = tmp_path / "models"  # the built-in model is converted here when it loads
    for reason, token in _refused_tokens(server, admin).items():
        proc = _worker(
            tmp_path,
            *("--server", server.url, "--registration-token", token),
            *("--name", f"w-{uuid.uuid4().hex[:6]}"),
            model_cache=model_cache,
        )
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 2, out
        errors = [line for line in out.splitlines() if line.startswith("error:")]
        assert errors == [
            f"error: the server {server.url} refused to register this worker (401: {reason}); "
            "ask an admin for a new registration token (POST /api/v1/registration-tokens)"
        ], out
        assert "Traceback" not in out
        assert "backend ready" not in out
        assert not model_cache.exists() or not any(model_cache.iterdir()), "the model loaded"


def test_a_worker_rejoining_from_its_token_file_says_so(
    server: LiveServer, admin: AsyncGrpoClient, tmp_path: Path
) -> None:
    token = admin.create_registration_token(max_uses=1)["token"]
    with AsyncGrpoClient(server.url) as anonymous:
        answer: dict[str, Any] = anonymous.register_worker(token, name="rejoins")
    token_file = tmp_path / "state" / "token.json"
    credentials.save(
        token_file, credentials.Credentials(str(answer["id"]), answer["token"], server.url)
    )
    proc = _worker(tmp_path, "--server", server.url, "--token-file", str(token_file))
    assert proc.stdout is not None
    try:
        deadline = time.monotonic() + 60
        seen = []
        while not any("rejoining as worker" in line for line in seen):
            assert time.monotonic() < deadline and proc.poll() is None, "".join(seen)
            seen.append(proc.stdout.readline())
        said = next(line for line in seen if "rejoining as worker" in line)
        assert f"rejoining as worker {answer['id']} (its token in {token_file})" in said
    finally:
        _stop(proc)


def test_a_revoked_worker_s_stored_token_ends_the_start_in_one_line_before_the_model_loads(
    server: LiveServer, admin: AsyncGrpoClient, tmp_path: Path
) -> None:
    token = admin.create_registration_token(max_uses=1)["token"]
    with AsyncGrpoClient(server.url) as anonymous:
        answer: dict[str, Any] = anonymous.register_worker(token, name="revoked-later")
    token_file = tmp_path / "state" / "token.json"
    credentials.save(
        token_file, credentials.Credentials(str(answer["id"]), answer["token"], server.url)
    )
    admin.revoke_worker(str(answer["id"]))
    model_cache = tmp_path / "models"
    proc = _worker(
        tmp_path, "--server", server.url, "--token-file", str(token_file), model_cache=model_cache
    )
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: the server {server.url} refused the worker token in {token_file} (401: token "
        "revoked); remove that file and start again with a new --registration-token"
    ], out
    assert "Traceback" not in out and "rejoining" not in out
    assert not model_cache.exists() or not any(model_cache.iterdir()), "the model loaded"
