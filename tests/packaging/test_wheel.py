"""The wheel carries everything the server reads from disk: built from a copy of the source tree,
installed into a fresh virtual environment and run from outside the repository, it migrates a
SQLite database and serves the login page and a static asset."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path
from typing import Any

import pytest
from jinja2 import FileSystemLoader

from server import migrate
from server.dashboard import web

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
PIP = [sys.executable, "-m", "pip"]
CHILD = Path(__file__).with_name("wheel_child.py")
# Not source (dot folders: .git, the virtual environments, caches). A stale build/ would put
# old files into the wheel.
NOT_SOURCE = shutil.ignore_patterns(
    ".*",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    "bucket",
    "asyncgrpo.db*",
    "asyncgrpo.secret",
    "test-artifacts",
)


def _run(argv: list[str | Path], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, **kwargs)
    assert out.returncode == 0, f"{argv}\n{out.stdout}\n{out.stderr}"
    return out


def _build_wheel(tmp: Path) -> Path:
    """--no-build-isolation: the build backend comes from this environment (the dev extra), so
    the build needs no index; pip checks it against [build-system].requires."""
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=NOT_SOURCE)
    pip_wheel = [*PIP, "wheel", src, "--no-deps", "-w", tmp / "dist"]
    _run([*pip_wheel, "--no-build-isolation", "--check-build-dependencies", "--no-index"])
    (wheel,) = (tmp / "dist").glob("asyncgrpo-*.whl")
    return wheel


def _install_into_fresh_venv(wheel: Path, venv: Path) -> Path:
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    _run([*PIP, "--python", python, "install", "--no-deps", "--no-index", wheel])
    return python


def _dependencies_only_env() -> dict[str, str]:
    """This environment's site-packages on PYTHONPATH, which (unlike site-packages proper) does
    not run .pth files: the editable install's path to the repository stays inactive."""
    paths = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "ASYNCGRPO_"))}
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def _files_under(directory: str | Path) -> set[str]:
    return {
        p.relative_to(ROOT).as_posix()
        for p in Path(directory).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def _read_from_disk() -> set[str]:
    """Every file under the folders the server reads at run time, relative to the repository."""
    loader = web.TEMPLATES.env.loader
    assert isinstance(loader, FileSystemLoader)
    folders = [*loader.searchpath, web.STATIC_DIR, migrate.MIGRATIONS]
    files = set().union(*(_files_under(folder) for folder in folders))
    assert any(f.endswith(".html") for f in files) and any(f.endswith(".js") for f in files)
    return files


def test_installed_wheel_serves_the_dashboard_outside_the_repository(tmp_path: Path) -> None:
    assert not tmp_path.is_relative_to(ROOT)
    wheel = _build_wheel(tmp_path)
    missing = _read_from_disk() - set(zipfile.ZipFile(wheel).namelist())
    assert not missing, f"not in the wheel: {sorted(missing)}"

    venv = tmp_path / "venv"
    python = _install_into_fresh_venv(wheel, venv)
    (htmx,) = web.STATIC_DIR.rglob("htmx-*.min.js")
    asset = htmx.relative_to(web.STATIC_DIR).as_posix()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    out = _run([python, CHILD, scratch, asset], cwd=scratch, env=_dependencies_only_env())
    result = json.loads(out.stdout.splitlines()[-1])

    assert Path(result["server_file"]).is_relative_to(venv)
    assert result["login"]["status"] == 200, result["login"]["text"][:2000]
    assert '<form method="post" action="/login"' in result["login"]["text"]
    assert 'name="token"' in result["login"]["text"]
    assert result["static"] == {
        "status": 200,
        "sha256": hashlib.sha256(htmx.read_bytes()).hexdigest(),
    }
