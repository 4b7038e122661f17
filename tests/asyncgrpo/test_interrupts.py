"""asyncgrpo/interrupts.py and asyncgrpo/parent_death.py: a signal is never lost or ignored,
never lands between a child's fork and its record, and no child outlives its starter."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import weakref
from pathlib import Path

import pytest

from asyncgrpo import cluster as cluster_module
from asyncgrpo import interrupts
from asyncgrpo.cluster import PACKAGE_ROOT, PARENT_DEATH, Cluster, ClusterConfig
from asyncgrpo.parent_death import PARENT_GONE_EXIT

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="/proc and the parent-death signal are Linux's"
)


def running(pid: int) -> bool:
    """False once `pid` has ended (a zombie has ended; it only waits for a reaper)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def wait_until(predicate, timeout_s: float = 15.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def python_with_sigint_ignored(script: str) -> subprocess.Popen[str]:
    """`script` in a Python started as a non-interactive shell starts a background job."""
    env = {**os.environ, "PYTHONPATH": str(PACKAGE_ROOT), "PYTHONUNBUFFERED": "1"}
    argv = ["bash", "-c", 'trap "" INT; exec "$0" "$@"', sys.executable, "-c", script]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)


@pytest.mark.integration  # a child interpreter
def test_sigint_interrupts_when_started_ignored() -> None:
    script = textwrap.dedent("""
        import signal, time
        from asyncgrpo import interrupts
        print("inherited", signal.getsignal(signal.SIGINT) == signal.SIG_IGN)
        interrupts.install()
        try:
            print("ready")
            time.sleep(60)
        except KeyboardInterrupt:
            print("interrupted")
    """)
    proc = python_with_sigint_ignored(script)
    assert proc.stdout is not None
    assert proc.stdout.readline().split() == ["inherited", "True"]
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=15)
    assert out.strip() == "interrupted"


@pytest.mark.e2e  # the Cluster starts its learner
@pytest.mark.timeout(60)
def test_a_signal_after_the_fork_waits_for_the_child_to_be_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injection: SIGINT lands just after Popen forked the learner, before the cluster
    recorded it; the interrupt comes once it is recorded, so the stop finds it."""
    real_popen = subprocess.Popen

    def popen_then_sigint(*args, **kwargs):  # type: ignore[no-untyped-def]
        proc = real_popen(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)  # the handler runs here, inside the fork-to-record window
        return proc

    monkeypatch.setattr(cluster_module.subprocess, "Popen", popen_then_sigint)
    cluster = Cluster(ClusterConfig(work_dir=tmp_path))
    cluster.run_id, cluster.learner_token = "00000000-0000-0000-0000-000000000000", "x"
    restore = interrupts.install()
    try:
        with pytest.raises(KeyboardInterrupt):
            cluster.start_learner()
        assert cluster.learner is not None
        pid = cluster.learner.pid
        with interrupts.deferred():  # after the one interrupt, signals are ignored
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)
    finally:
        restore()
        cluster.stop(grace_s=5)
    assert wait_until(lambda: not running(pid))


@pytest.mark.integration  # child interpreters
def test_children_die_with_a_killed_parent(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from asyncgrpo.cluster import ManagedProcess
        child = ManagedProcess("sleeper", [sys.executable, "-c", "import time; time.sleep(600)"],
                               {{}}, Path({str(tmp_path)!r}), Path({str(tmp_path / "log")!r}))
        print(child.start().pid)
        time.sleep(600)
    """)
    parent = python_with_sigint_ignored(script)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert running(child)
    parent.kill()
    parent.wait()
    assert wait_until(lambda: not running(child)), f"child {child} outlived its parent"


@pytest.mark.integration  # child interpreters
def test_parent_death_runs_nothing_when_the_parent_is_already_gone(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    gone = subprocess.run(
        [sys.executable, "-I", str(PARENT_DEATH), "999999999", "touch", str(marker)]
    )
    assert gone.returncode == PARENT_GONE_EXIT
    assert not marker.exists()
    ok = subprocess.run(
        [sys.executable, "-I", str(PARENT_DEATH), str(os.getpid()), "touch", str(marker)]
    )
    assert ok.returncode == 0 and marker.exists()


@pytest.mark.integration  # a child interpreter
@pytest.mark.parametrize("forget", [True, False])
def test_interrupt_caught_inside_a_string_exec_keeps_the_exit_code(
    tmp_path: Path, forget: bool
) -> None:
    """A Ctrl-C that lands while a string `exec` runs (an import defining a dataclass, as the
    demo's start-up does) and is handled leaves a `python -m` process's exit code to the program
    once `forget_caught()` ran; without it, CPython ends the process by SIGINT (the demo's
    `starting the server` flake: exit status -2 after printing that it stopped)."""
    (tmp_path / "interrupted_in_exec.py").write_text(
        textwrap.dedent(f"""
            import os, signal, sys, time
            from asyncgrpo import interrupts
            interrupts.install()
            try:
                exec("os.kill(os.getpid(), signal.SIGINT); time.sleep(30)")
            except KeyboardInterrupt:
                print("caught")
            if {forget}:
                interrupts.forget_caught()
            sys.exit(130)
        """)
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{PACKAGE_ROOT}"}
    done = subprocess.run(
        [sys.executable, "-m", "interrupted_in_exec"], env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.stdout.strip() == "caught", done.stderr
    expected = 130 if forget else -signal.SIGINT
    assert done.returncode == expected, done.stderr


def test_an_interrupt_lost_in_a_weakref_callback_is_raised_by_check() -> None:
    """CPython ignores an exception raised while it runs a weakref callback ("Exception ignored
    in …"): a Ctrl-C landing there raised nothing, and `local` went on starting its learner.
    The owner's wait loops call check(), which raises it."""

    class Collected:
        pass

    def callback(_ref: object) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler runs here, inside the callback

    restore = interrupts.install()
    try:
        interrupts.check()  # nothing raised yet: a no-op
        obj = Collected()
        ref = weakref.ref(obj, callback)
        del obj  # the callback runs; its KeyboardInterrupt is dropped by CPython
        assert ref() is None
        with pytest.raises(KeyboardInterrupt):
            interrupts.check()
        interrupts.stopping()
        interrupts.check()  # the owner caught it: nothing more to raise
    finally:
        restore()
