"""`python -I parent_death.py PARENT_PID COMMAND [ARG...]`: exec COMMAND so that it dies with
PARENT_PID, even when that is killed with SIGKILL.

It sets the parent-death signal (Linux prctl PR_SET_PDEATHSIG, SIGKILL), which execve keeps,
so COMMAND keeps this pid and is killed when its parent dies; a parent that died before the
prctl would never send it, so then COMMAND is not run. `asyncgrpo/cluster.py` uses it on Linux
only (elsewhere there is no such signal). A wrapper rather than a `preexec_fn`: Python code
between fork and exec can deadlock in a parent with threads. Standard library only (it runs
under `python -I`).

The kernel sends the signal when the *thread* that forked the wrapper ends: start children from
a thread that lives as long as they should (the main thread).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
PARENT_GONE_EXIT = 125


def die_with_parent(parent: int) -> bool:
    """Arrange SIGKILL at `parent`'s death; False when `parent` is already gone."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    return os.getppid() == parent


def main(argv: list[str]) -> None:
    parent, command = int(argv[1]), argv[2:]
    if not die_with_parent(parent):
        os._exit(PARENT_GONE_EXIT)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv)
