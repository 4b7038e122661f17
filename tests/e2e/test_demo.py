"""`asyncgrpo demo` stops every process it started on Ctrl-C, at any moment, and its children
never outlive it, even when it is killed with SIGKILL."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.owner import Owner, descendants, interrupt_stops_every_process

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

START_S = 240.0  # the server, then three model loads on two shared cores
STOP_S = 20.0  # from the signal to the demo's exit (about 4 s on two shared cores)


def start_demo(tmp_path: Path) -> Owner:
    """The demo with two workers, set for far more versions than can be trained before the
    signal."""
    work = tmp_path / "demo"
    return Owner(tmp_path, work, ["demo", "--workers", "2", "--versions", "50", "--dir", str(work)])


def reach(demo: Owner, moment: str) -> None:
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
    demo = start_demo(tmp_path)
    try:
        reach(demo, moment)
        stopped = interrupt_stops_every_process(demo, STOP_S)
        if moment in ("loading the model", "training"):
            out = demo.output()
            assert stopped == 4, out
            assert "dashboard: http://127.0.0.1:" in out and "admin token: agr_adm_" in out, out
    finally:
        demo.kill()


def grandchildren(demo: Owner) -> set[int]:
    """The live processes below the demo's children (the learner's reward processes)."""
    return {pid for child in demo.children() for pid in descendants(child)}


@pytest.mark.timeout(600)
def test_sigkill_leaves_no_child(tmp_path: Path, small_model_dir: str) -> None:
    """kill -9 of the demo once every process is up, the learner's reward processes (its own
    children) included: the server, learner, workers and those children all end. (Not at
    version 1: what ends them, the parent-death signal and the watch of the parent, does not
    depend on training, and reaching version 1 costs minutes on two shared cores.)"""
    demo = start_demo(tmp_path)
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
