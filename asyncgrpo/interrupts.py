"""SIGINT and SIGTERM as one `KeyboardInterrupt` for a process that owns children (the demo).

- Installed whatever the inherited disposition: a non-interactive shell starts a background job
  (`cmd &`) with SIGINT ignored, and Python then keeps it ignored, so relying on Python's default
  handler let such a demo train on through its Ctrl-C.
- Raised once: a second signal while the children are being stopped is ignored (an interrupted
  stop would leave orphans).
- Held inside `deferred()`: a signal that lands between a child's fork and the moment its handle
  is recorded is raised when the block ends, so the stop always knows every child.
- Raised again if it was lost: CPython drops an exception raised while it runs a weakref or
  garbage-collection callback ("Exception ignored in …"), so a Ctrl-C landing there raised
  nothing; the owner's wait loops call `check()`, which raises the lost interrupt.
- Forgotten once caught (`forget_caught()`): CPython marks a KeyboardInterrupt that ends a
  string `exec` as unhandled even when a caller catches it, and a `python -m` process so marked
  exits by SIGINT instead of with its own exit code.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _State:
    held = 0  # depth of deferred() blocks
    pending = False  # a signal arrived while held
    raised = False  # the one KeyboardInterrupt was raised
    stopping = False  # the owner caught it (or stops anyway): signals are ignored


_state = _State()


def _on_signal(_signum: int, _frame: FrameType | None) -> None:
    if _state.raised or _state.stopping:
        return
    if _state.held:
        _state.pending = True
        return
    _state.raised = True
    raise KeyboardInterrupt


def install() -> Callable[[], None]:
    """Route SIGINT and SIGTERM here (main thread only); returns what restores the previous
    handlers."""
    _state.held, _state.pending, _state.raised, _state.stopping = 0, False, False, False
    previous = {sig: signal.signal(sig, _on_signal) for sig in SIGNALS}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore


def stopping() -> None:
    """From now on, signals are ignored (the owner is stopping its children)."""
    _state.stopping = True


def check() -> None:
    """Raise the interrupt again if it was raised but never reached the owner (it landed in a
    callback whose exceptions CPython ignores); a no-op otherwise, and where `install` never
    ran. The owner's wait loops call it."""
    if _state.raised and not _state.stopping:
        raise KeyboardInterrupt


@contextmanager
def deferred() -> Iterator[None]:
    """Hold a signal until the block ends (then raise it). A no-op where `install` never ran."""
    _state.held += 1
    try:
        yield
    finally:
        _state.held -= 1
        if not _state.held and _state.pending and not (_state.raised or _state.stopping):
            _state.pending, _state.raised = False, True
            raise KeyboardInterrupt


def forget_caught() -> None:
    """Clear CPython's mark of an unhandled KeyboardInterrupt, once the interrupt was handled.

    A KeyboardInterrupt raised while a string `exec` runs (dataclasses and namedtuple run one as
    a module is imported, so a Ctrl-C during start-up often lands there) leaves the interpreter
    marked: whatever the program then does, `python -m …` ends by SIGINT (exit status -2 to its
    parent) instead of with its exit code. Each string `exec` resets the mark before it runs, so
    one that ends normally leaves the process unmarked."""
    exec("None")
