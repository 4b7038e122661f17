"""A command that owns child processes (`asyncgrpo demo`, `asyncgrpo local`) as a subprocess of
the test: its output in a file, every descendant it ever had collected while the test waits
(read from /proc, Linux), and the waits on its conditions, each with a deadline."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from asyncgrpo.cluster import PACKAGE_ROOT

REAP_S = 15.0  # from the owner's exit (or kill) to the last child gone


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


class Owner:
    """`python -m asyncgrpo.cli ARGS…` with its work dir `work_dir` (the command's --dir),
    started with SIGINT ignored, as a non-interactive shell starts a background job (`cmd &`,
    e.g. under a CI runner) and Python then keeps it ignored: the command must install its own
    handler."""

    def __init__(self, tmp_path: Path, work_dir: Path, args: Sequence[str]) -> None:
        self.dir = work_dir
        self.out_path = tmp_path / "owner.out"
        env = {**os.environ, "PYTHONPATH": str(PACKAGE_ROOT), "PYTHONUNBUFFERED": "1"}
        argv = [
            "bash", "-c", 'trap "" INT; exec "$0" "$@"', sys.executable, "-m", "asyncgrpo.cli",
            *args,
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
            assert self.proc.poll() is None, f"it exited before {what}:\n{self.output()}"
            if predicate():
                self.seen |= descendants(self.proc.pid)
                return
            time.sleep(0.2)
        raise AssertionError(f"timed out after {timeout_s}s waiting for {what}\n{self.output()}")

    def version(self) -> int:
        """The highest current_version of the runs in the work dir's database."""
        try:
            with sqlite3.connect(f"file:{self.dir / 'asyncgrpo.db'}?mode=ro", uri=True) as db:
                row = db.execute("SELECT max(current_version) FROM runs").fetchone()
        except sqlite3.Error:  # not created yet, or locked by a writer for a moment
            return 0
        return int(row[0] or 0)

    def wait_exit(self, timeout_s: float) -> float:
        """Collects descendants until the command exits; returns the seconds it took."""
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


def interrupt_stops_every_process(owner: Owner, stop_s: float) -> int:
    """SIGINT to the owner: it exits 130 within `stop_s`, saying it stopped at least the
    children it had, and none of them outlives it; returns how many it says it stopped."""
    started = owner.children()
    owner.proc.send_signal(signal.SIGINT)
    took = owner.wait_exit(stop_s)
    out = owner.output()
    print(f"exited {took:.1f}s after SIGINT, {len(started)} children")
    assert owner.proc.returncode == 130, out
    assert "interrupted: stopping every process" in out, out
    stopped = re.search(r"stopped (\d+) processes", out)
    assert stopped is not None, out
    assert int(stopped.group(1)) >= len(started), out
    owner.assert_no_child_left()
    return int(stopped.group(1))
