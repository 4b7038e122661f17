"""`asyncgrpo learner` with broken launcher variables (WORLD_SIZE without RANK, a non-number,
no MASTER_ADDR) exits 2 naming the variable, not with a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# integration: starts learner ranks as subprocesses
pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
REPO = Path(__file__).resolve().parents[2]
BASE = [
    sys.executable,
    "-m",
    "asyncgrpo.cli",
    "learner",
    "--server",
    "http://127.0.0.1:9",
    "--run",
    "00000000-0000-0000-0000-000000000001",
    "--token",
    "agr_lrn_x",
]


def _run(extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.pop("MASTER_ADDR", None)
    env.pop("MASTER_PORT", None)
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", **extra)
    return subprocess.run(BASE, env=env, capture_output=True, text=True, timeout=100, cwd=REPO)


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"WORLD_SIZE": "2"}, "RANK"),
        ({"WORLD_SIZE": "two", "RANK": "0"}, "WORLD_SIZE"),
        ({"WORLD_SIZE": "2", "RANK": "5"}, "RANK"),
        ({"WORLD_SIZE": "2", "RANK": "0"}, "MASTER_ADDR"),
    ],
)
def test_broken_rank_variables_exit_2_with_the_reason(extra: dict[str, str], named: str) -> None:
    done = _run(extra)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert named in done.stderr
