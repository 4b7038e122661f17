"""`asyncgrpo demo` stops every process it started on Ctrl-C: no orphans."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asyncgrpo.cluster import PACKAGE_ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.timeout(180)
def test_ctrl_c_stops_every_process(tmp_path: Path, small_model_dir: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(PACKAGE_ROOT)}
    # Far more versions than can be trained before the Ctrl-C: the demo must not end first.
    demo = subprocess.Popen(
        [sys.executable, "-m", "asyncgrpo.cli", "demo", "--workers", "2", "--versions", "50",
         "--dir", str(tmp_path / "demo")],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        seen: set[int] = set()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(seen) < 4:  # server, learner, two workers
            seen |= descendants(demo.pid)
            assert demo.poll() is None, demo.stdout.read() if demo.stdout else ""
            time.sleep(0.5)
        assert len(seen) >= 4, seen
        time.sleep(3)  # the children are busy loading the model
        seen |= descendants(demo.pid)
        demo.send_signal(signal.SIGINT)
        out, _ = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert "interrupted: stopping every process" in out, out
    assert "stopped 4 processes" in out, out
    assert "dashboard: http://127.0.0.1:" in out and "admin token: agr_adm_" in out, out
    assert demo.returncode == 130, out
    left = [pid for pid in seen if not gone(pid)]
    assert left == [], f"orphans: {left}\n{out}"
