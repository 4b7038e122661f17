"""One engine shared by every held lease, and what happens when it dies.

An engine death (vLLM's EngineDeadError, an out-of-memory) fails every generation it was running
at once. Each of those leases is released with the reason `engine_fault` by its own thread; the
engine is restarted once per death (the first lease to report it restarts it after the others
have left the engine; later reports of the same death change nothing), and no new generation
starts from the moment the death is seen (before any lease is released) until the restart is
done. `FaultWindow` decides when deaths come too often.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable, Iterator


class EngineFailing(SystemExit):
    """The engine died engine_fault_limit times within engine_fault_window_s: the worker stops
    (a supervisor, or the spot fleet, may start a fresh one)."""


class FaultWindow:
    """Engine deaths within a sliding window of monotonic time."""

    def __init__(self, limit: int, window_s: float) -> None:
        self.limit, self.window_s = limit, window_s
        self.times: collections.deque[float] = collections.deque()

    def record(self, now: float) -> bool:
        """Count a death now; True when the limit is reached within the window."""
        self.times.append(now)
        while self.times and now - self.times[0] > self.window_s:
            self.times.popleft()
        return len(self.times) >= self.limit


class EngineGuard:
    """Counts the generations in the engine, and restarts it once per death."""

    def __init__(self, restart: Callable[[str], None]) -> None:
        self._restart = restart
        self._changed = threading.Condition()
        self._active = 0
        self._epoch = 0  # bumped by every death: generations of an older epoch saw that death
        self._restarting = False

    @property
    def epoch(self) -> int:
        """The engine's current epoch (for a death seen outside a generation: a load)."""
        with self._changed:
            return self._epoch

    @contextlib.contextmanager
    def generating(self) -> Iterator[int]:
        """Around one generation: waits while the engine restarts; yields the engine's epoch,
        which `fault` needs to tell one death from the next."""
        with self._changed:
            self._changed.wait_for(lambda: not self._restarting)
            self._active += 1
            epoch = self._epoch
        try:
            yield epoch
        finally:
            with self._changed:
                self._active -= 1
                self._changed.notify_all()

    def close(self, epoch: int) -> bool:
        """A generation (or a load) of `epoch` saw the engine die: from now on no generation
        starts until `reopen`. Called at once, before the lease is released: a release requeues
        its prompts, and a lease granted on them must not start on the dead engine. True for
        the first report of this death, whose caller must then call `reopen`."""
        with self._changed:
            if epoch != self._epoch:
                return False
            self._epoch += 1
            self._restarting = True
            return True

    def reopen(self, why: str) -> None:
        """Restarts the engine once no generation is in it, then lets generations start again;
        the restart may raise (EngineFailing, or the worker stopping), and the guard opens
        again anyway."""
        with self._changed:
            self._changed.wait_for(lambda: self._active == 0)
        try:
            self._restart(why)
        finally:
            with self._changed:
                self._restarting = False
                self._changed.notify_all()

    def fault(self, epoch: int, why: str) -> None:
        """`close`, and `reopen` when this is the first report of the death."""
        if self.close(epoch):
            self.reopen(why)
