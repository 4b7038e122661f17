"""bench/datasets.py on a tiny file: it uploads, becomes ready, prepares a run and reports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# integration: runs the benchmark as a subprocess
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(120)
def test_the_benchmark_runs_on_a_tiny_file() -> None:
    done = subprocess.run(
        [sys.executable, "bench/datasets.py", "--rows", "300", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["rows"] == 300 and figures["queued_prompt_rows"] == 300
    assert 0 < figures["ready_s"] and 0 < figures["run_prepared_s"]
    assert figures["rss_peak_mb"] >= figures["rss_idle_mb"] > 0
