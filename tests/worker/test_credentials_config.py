"""Worker token file (mode 0600, reused, per server) and settings parsing."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from pydantic import ValidationError

from worker import credentials
from worker.config import WorkerSettings


def test_token_file_is_private_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "state" / "token.json"
    creds = credentials.Credentials("w-1", "agr_wkr_secret", "http://srv:8000/")
    credentials.save(path, creds)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    loaded = credentials.load(path, "http://srv:8000")
    assert loaded is not None
    assert (loaded.worker_id, loaded.token) == ("w-1", "agr_wkr_secret")
    # A token for another server is not used there.
    assert credentials.load(path, "http://other:8000") is None


def test_overwrite_keeps_mode_even_with_permissive_umask(tmp_path: Path) -> None:
    import os

    path = tmp_path / "token.json"
    old = os.umask(0)
    try:
        credentials.save(path, credentials.Credentials("a", "t1", "http://s"))
        credentials.save(path, credentials.Credentials("b", "t2", "http://s"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    loaded = credentials.load(path, "http://s")
    assert loaded is not None and loaded.token == "t2"


def test_garbage_token_file_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "token.json"
    path.write_text("not json")
    assert credentials.load(path, "http://s") is None


def test_settings_from_env_and_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCGRPO_WORKER_SERVER_URL", "http://env:1")
    monkeypatch.setenv("ASYNCGRPO_WORKER_BACKEND", "vllm")
    s = WorkerSettings()
    assert s.server_url == "http://env:1" and s.backend == "vllm"
    with pytest.raises(ValidationError, match="backend"):
        WorkerSettings(backend="tensorrt")
    with pytest.raises(ValidationError, match="idle_backoff_min_s must not exceed"):
        WorkerSettings(idle_backoff_min_s=5, idle_backoff_max_s=1)


@pytest.mark.integration  # a fresh interpreter
def test_worker_command_imports_no_web_stack() -> None:
    """`asyncgrpo worker` parses its settings without importing fastapi, sqlalchemy or torch."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from asyncgrpo.cli import app\n"
        "r = CliRunner().invoke(app, ['worker', '--backend', 'nope', '--server', 'http://x'])\n"
        "assert r.exit_code == 2, r.output\n"
        "assert 'backend' in r.output, r.output\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('fastapi', 'sqlalchemy', 'torch')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])
