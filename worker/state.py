"""One worker process per token file: a lock held for the process's life.

Two processes sharing a token file would be one worker to the server (one id, one heartbeat
view of the leases) while each holds its own leases. The second is refused at start, before
its model loads, with the file and the holder's pid. The lock is `<token_file>.lock`
(filelock: released by the OS when the holder dies, even on kill -9); the holder's pid is in
`<token_file>.pid`, a file of its own because opening the lock file truncates it."""

from __future__ import annotations

import os
from pathlib import Path

from filelock import FileLock, Timeout


class StateInUse(RuntimeError):
    """Another live process holds this token file."""


class StateLock:
    def __init__(self, token_file: Path) -> None:
        self.token_file = token_file
        self._lock = FileLock(str(token_file) + ".lock", timeout=0)
        self._pid_file = Path(str(token_file) + ".pid")

    def acquire(self) -> StateLock:
        """Hold the lock (until release() or the process ends); StateInUse when another holds
        it."""
        self.token_file.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire()
        except Timeout:
            raise StateInUse(
                f"the token file {self.token_file} is in use by another worker process"
                f"{self._holder()}: give each worker its own --name (its state folder) or "
                "--token-file"
            ) from None
        self._pid_file.write_text(f"{os.getpid()}\n")
        return self

    def _holder(self) -> str:
        try:
            pid = int(self._pid_file.read_text().strip())
        except (OSError, ValueError):
            return ""
        return f" (pid {pid})"

    def release(self) -> None:
        self._lock.release()
