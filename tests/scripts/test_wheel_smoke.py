"""scripts/wheel_smoke.py, the smoke test scripts/upgrade_deps.sh runs on the wheel in a fresh
virtualenv: here on this environment's install, from a scratch folder outside the repository.
It starts the server on the embedded default and round trips a worker and a learner through
the typed client; its one JSON line reports what each call answered."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]  # a server subprocess

ROOT = Path(__file__).resolve().parents[2]


def test_the_smoke_test_round_trips_a_worker_and_a_learner(
    tmp_path: Path, subprocess_allowed: None
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCGRPO_")}
    env["PYTHONPATH"] = str(ROOT)  # this checkout, as the wheel would provide it
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "wheel_smoke.py"), str(tmp_path / "scratch")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["lease_prompts"] == 2 and result["released_prompts"] == 2
    assert result["run_status"] == "running" and result["claimed_batches"] == 0
    assert (tmp_path / "scratch" / "asyncgrpo.db").exists()  # the embedded default, in scratch


def test_a_server_that_cannot_start_fails_the_smoke_test(
    tmp_path: Path, subprocess_allowed: None
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCGRPO_")}
    env["PYTHONPATH"] = str(ROOT)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "asyncgrpo.db").write_text("not a database")
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "wheel_smoke.py"), str(scratch)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert out.returncode != 0
    assert "failed" in out.stderr or "exited" in out.stderr
