"""One call run beside training (docs/architecture/learner.md, "The learner"): on its own thread
when the learner overlaps, or when its result is first asked for when it does not (the serial loop,
kept for comparison). Either way the caller sees the same thing: `result()` returns the value or
raises the call's exception on the caller's thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")
POLL_S = 0.2


def _nothing() -> None:
    return None


class Pending(Generic[T]):
    """`fn()` started now on a thread (background) or run lazily by `result()` (inline)."""

    def __init__(self, name: str, fn: Callable[[], T], *, background: bool) -> None:
        self.name = name
        self._fn = fn
        self._done = threading.Event()
        self._value: T | None = None
        self._error: BaseException | None = None
        self.seconds = 0.0  # how long fn ran
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._run, name=name, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        started = time.perf_counter()
        try:
            self._value = self._fn()
        except BaseException as exc:  # handed to the caller's thread by result()
            self._error = exc
        finally:
            self.seconds = time.perf_counter() - started
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def error(self) -> BaseException | None:
        """The exception of a finished call (None while running or when it succeeded)."""
        return self._error if self._done.is_set() else None

    def result(self, poll: Callable[[], None] = _nothing) -> T:
        """Wait for the value, calling `poll()` every POLL_S (it raises to stop waiting)."""
        if self._thread is None and not self._done.is_set():
            self._run()
        while not self._done.wait(POLL_S):
            poll()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]

    def join(self, timeout_s: float) -> None:
        """Wait (bounded) for a background call to end, its outcome ignored."""
        if self._thread is not None:
            self._thread.join(timeout_s)
