"""deploy/skypilot/worker.yaml against SkyPilot's own task schema and loader, in their own
virtual environment (.venv-skypilot, scripts/install_skypilot.sh, which scripts/test.sh runs).
Offline: nothing is launched."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.manifests import ROOT, SKYPILOT

PYTHON = ROOT / ".venv-skypilot" / "bin" / "python"
CHECK = Path(__file__).with_name("skypilot_check.py")

# integration: runs SkyPilot's CLI
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not PYTHON.exists(),
        reason=".venv-skypilot is absent: run scripts/install_skypilot.sh to check the SkyPilot "
        "task",
    ),
]


def _check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(PYTHON), str(CHECK), str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,  # the task's `workdir: .` is the repository
        timeout=120,
    )


def test_worker_task_passes_skypilot_schema() -> None:
    result = _check(SKYPILOT)
    assert result.returncode == 0, result.stderr
    task = json.loads(result.stdout)
    assert all(r["use_spot"] for r in task["resources"])
    assert {g for r in task["resources"] for g in r["accelerators"]} >= {"L4", "A10G", "H100"}
    assert all(r["cloud"] == "None" for r in task["resources"])  # any cloud
    assert "ASYNCGRPO_WORKER_SERVER_URL" in task["envs"]


def test_skypilot_refuses_a_bad_field(tmp_path: Path) -> None:
    """The check can fail: SkyPilot's schema refuses a misspelt resources field."""
    task = yaml.safe_load(SKYPILOT.read_text())
    task["resources"]["use_spots"] = task["resources"].pop("use_spot")
    bad = tmp_path / "worker.yaml"
    bad.write_text(yaml.safe_dump(task))
    result = _check(bad)
    assert result.returncode == 1 and "use_spots" in result.stderr


def test_run_starts_the_worker_with_exec() -> None:
    task = yaml.safe_load(SKYPILOT.read_text())
    assert "exec " in task["run"] and "asyncgrpo worker" in task["run"]
    setup = task["setup"]
    assert "--require-hashes locks/worker-vm.txt" in setup and "--no-deps ." in setup
    assert (ROOT / "locks" / "worker-vm.txt").exists()
