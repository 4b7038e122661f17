"""`asyncgrpo local examples/runs/arithmetic.json --device cpu` runs a user's run to its end on
this machine (the embedded server, the learner and a transformers worker with the small model
the example names), with the live table and the summary; Ctrl-C stops every process it
started. `local` starts the worker, waits for its engine, then starts the learner."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from asyncgrpo.cluster import PACKAGE_ROOT
from tests.harness.owner import Owner, interrupt_stops_every_process

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXAMPLE = PACKAGE_ROOT / "examples" / "runs" / "arithmetic.json"
START_S = 240.0  # the server, then two model loads on two shared cores
RUN_S = START_S + 300.0  # and one version: 64 samples of up to 32 tokens, one step
STOP_S = 20.0  # from the signal to the exit


def start_local(tmp_path: Path, *args: str) -> Owner:
    work = tmp_path / "local"
    argv = ["local", str(EXAMPLE), "--device", "cpu", "--workers", "1", "--dir", str(work)]
    return Owner(tmp_path, work, [*argv, *args])


def run_status(work: Path) -> list[tuple[str, int]]:
    with sqlite3.connect(f"file:{work / 'asyncgrpo.db'}?mode=ro", uri=True) as db:
        return [(str(s), int(v)) for s, v in db.execute("SELECT status, current_version FROM runs")]


@pytest.mark.timeout(RUN_S + 60)
def test_local_completes_the_example_run(tmp_path: Path, small_model_dir: str) -> None:
    """The fewest versions that make a completed run: one (--max-versions 1)."""
    local = start_local(tmp_path, "--max-versions", "1")
    try:
        took = local.wait_exit(RUN_S)
        out = local.output()
        print(f"completed in {took:.0f}s")
        assert local.proc.returncode == 0, out
        assert run_status(local.dir) == [("completed", 1)], out
        assert "asyncgrpo local" in out, out  # the live table's last frame
        assert "the learner are starting (cpu, transformers, float32)" in out, out
        assert re.search(r"run status\s+│\s+completed", out), out  # the summary
        assert re.search(r"versions published\s+│\s+1\b", out), out
        bucket = re.search(r"final adapter \(v1\) in the bucket: (\S+)", out)
        assert bucket is not None, out
        assert (Path(bucket.group(1)) / "adapter_config.json").is_file(), out
        assert re.search(r"^stopped 3 processes$", out, re.MULTILINE), out  # after the frame
        local.assert_no_child_left()
    finally:
        local.kill()


@pytest.mark.timeout(START_S + 120)
def test_ctrl_c_while_a_worker_starts_its_engine_stops_every_process(
    tmp_path: Path, small_model_dir: str
) -> None:
    """Ctrl-C while `local` waits for the worker's engine before it starts the learner (the
    wait only `local` has; the demo's tests interrupt the moments they share)."""
    local = start_local(tmp_path)
    try:
        starting = "local-worker-1: starting its engine…"
        local.wait_for(starting, lambda: starting in local.output(), START_S)
        local.wait_for("the server and the worker", lambda: len(local.children()) == 2, 60)
        assert local.version() == 0
        assert interrupt_stops_every_process(local, STOP_S) >= 2
    finally:
        local.kill()
