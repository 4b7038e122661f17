"""`asyncgrpo demo` stops every process it started on Ctrl-C, at any moment, and its children
never outlive it, even when it is killed with SIGKILL."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from asyncgrpo.cluster import PACKAGE_ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

START_S = 240.0  # the server, then three model loads on two shared cores
STOP_S = 20.0  # from the signal to the demo's exit (about 4 s on two shared cores)
REAP_S = 15.0  # from the demo's exit (or kill) to the last child gone


def process_table() -> dict[int, tuple[int, str]]:
    """pid -> (ppid, state) of every process (read from /proc)."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        table[int(entry.name)] = (int(ppid), state)
    return table


def descendants(pid: int) -> set[int]:
    """Every live process below `pid`."""
    children: dict[int, list[int]] = {}
    for child, (ppid, _state) in process_table().items():
        children.setdefault(ppid, []).append(child)
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pids: set[int]) -> set[int]:
    """The pids still running (a zombie has ended: it only waits for a reaper)."""
    table = process_table()
    return {pid for pid in pids if pid in table and table[pid][1] not in ("Z", "X")}


class Demo:
    """`asyncgrpo demo` as a subprocess, its output in a file, every descendant it ever had
    collected while the test waits."""

    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path / "demo"
        self.out_path = tmp_path / "demo.out"
        env = {**os.environ, "PYTHONPATH": str(PACKAGE_ROOT), "PYTHONUNBUFFERED": "1"}
        # Started with SIGINT ignored, as a non-interactive shell starts a background job
        # (`cmd &`, e.g. under a CI runner) and Python then keeps it ignored: the demo must
        # install its own handler. Far more versions than can be trained before the signal.
        argv = [
            "bash", "-c", 'trap "" INT; exec "$0" "$@"', sys.executable, "-m", "asyncgrpo.cli",
            "demo", "--workers", "2", "--versions", "50", "--dir", str(self.dir),
        ]  # fmt: skip
        with self.out_path.open("w") as out:
            self.proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=out, stderr=out)
        self.seen: set[int] = set()

    def output(self) -> str:
        return self.out_path.read_text(errors="replace")

    def children(self) -> set[int]:
        table = process_table()
        return {pid for pid in alive(self.seen) if table[pid][0] == self.proc.pid}

    def wait_for(self, what: str, predicate: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.seen |= descendants(self.proc.pid)
            assert self.proc.poll() is None, f"the demo exited before {what}:\n{self.output()}"
            if predicate():
                self.seen |= descendants(self.proc.pid)
                return
            time.sleep(0.2)
        raise AssertionError(f"timed out after {timeout_s}s waiting for {what}\n{self.output()}")

    def version(self) -> int:
        try:
            with sqlite3.connect(f"file:{self.dir / 'asyncgrpo.db'}?mode=ro", uri=True) as db:
                row = db.execute("SELECT max(current_version) FROM runs").fetchone()
        except sqlite3.Error:  # not created yet, or locked by a writer for a moment
            return 0
        return int(row[0] or 0)

    def wait_exit(self, timeout_s: float) -> float:
        """Collects descendants until the demo exits; returns the seconds it took."""
        started = time.monotonic()
        while self.proc.poll() is None and time.monotonic() - started < timeout_s:
            self.seen |= descendants(self.proc.pid)
            time.sleep(0.1)
        took = time.monotonic() - started
        assert self.proc.poll() is not None, f"still running {took:.0f}s on:\n{self.output()}"
        return took

    def assert_no_child_left(self) -> None:
        deadline = time.monotonic() + REAP_S
        while alive(self.seen) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(self.seen), f"orphans: {sorted(alive(self.seen))}\n{self.output()}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in alive(self.seen):  # what a failed test left
            os.kill(pid, signal.SIGKILL)


def reach(demo: Demo, moment: str) -> None:
    """Wait until the demo is at `moment`."""
    if moment == "starting the server":
        demo.wait_for(moment, lambda: "starting the server…" in demo.output(), 120)
    elif moment == "starting the children":
        demo.wait_for(moment, lambda: "the learner are starting" in demo.output(), START_S)
    elif moment == "loading the model":  # server, learner and two workers up, none trained
        demo.wait_for(moment, lambda: len(demo.children()) == 4, START_S)
        assert demo.version() == 0
    elif moment == "training":
        demo.wait_for(moment, lambda: demo.version() >= 1, START_S + 120)
    else:
        raise ValueError(moment)


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "moment", ["starting the server", "starting the children", "loading the model", "training"]
)
def test_ctrl_c_stops_every_process(tmp_path: Path, small_model_dir: str, moment: str) -> None:
    demo = Demo(tmp_path)
    try:
        reach(demo, moment)
        started = demo.children()
        demo.proc.send_signal(signal.SIGINT)
        took = demo.wait_exit(STOP_S)
        out = demo.output()
        print(f"{moment}: exited {took:.1f}s after SIGINT, {len(started)} children")
        assert demo.proc.returncode == 130, out
        assert "interrupted: stopping every process" in out, out
        stopped = re.search(r"stopped (\d+) processes", out)
        assert stopped is not None, out
        assert int(stopped.group(1)) >= len(started), out
        if moment in ("loading the model", "training"):
            assert int(stopped.group(1)) == 4, out
            assert "dashboard: http://127.0.0.1:" in out and "admin token: agr_adm_" in out, out
        demo.assert_no_child_left()
    finally:
        demo.kill()


def grandchildren(demo: Demo) -> set[int]:
    """The live processes below the demo's children (the learner's reward processes)."""
    return {pid for child in demo.children() for pid in descendants(child)}


@pytest.mark.timeout(600)
def test_sigkill_leaves_no_child(tmp_path: Path, small_model_dir: str) -> None:
    """kill -9 of the demo once every process is up, the learner's reward processes (its own
    children) included: the server, learner, workers and those children all end. (Not at
    version 1: what ends them, the parent-death signal and the watch of the parent, does not
    depend on training, and reaching version 1 costs minutes on two shared cores.)"""
    demo = Demo(tmp_path)
    try:
        reach(demo, "loading the model")
        demo.wait_for("the learner's reward processes", lambda: bool(grandchildren(demo)), START_S)
        assert len(demo.children()) == 4
        assert grandchildren(demo) <= demo.seen
        demo.proc.kill()
        demo.proc.wait()
        demo.assert_no_child_left()
    finally:
        demo.kill()
