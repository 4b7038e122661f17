"""Wake-ups of the waiting calls (docs/architecture/protocol.md, "Waiting without polling"):
a transaction that may have made work appear signals its channel once it commits, and the
long-polls waiting on that channel try again at once instead of polling the database.

- In process: one notifier per process (`WAKEUPS`), an event per channel per event loop, set
  from any thread after the signalling transaction committed (`after_commit`).
- Across processes (Postgres): the signalling transaction also runs `pg_notify`, which
  Postgres delivers at commit only, and each app holds one listening connection (`Listener`)
  that hands what other processes signalled to this process's notifier.

A waiter that misses a signal (a listener reconnecting, a process that died between commit and
signal) still tries every `long_poll_interval_s`: the fallback poll.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Iterable
from types import FrameType
from typing import Any

import psycopg
from sqlalchemy import event, func, literal_column, select
from sqlalchemy.orm import Session

log = logging.getLogger(__name__)

# What may have appeared, by who waits for it.
LEASES = "asyncgrpo_leases"  # a grant: rows queued, room under a bound, a run leasing again
LEARNER = "asyncgrpo_learner"  # a learner's claim: a batch accepted, a version, a run's end
CHANNELS = (LEASES, LEARNER)

_PENDING = "asyncgrpo_wakeups"  # session.info key: the channels its transaction signals
_ORIGIN = str(os.getpid())  # a NOTIFY's payload: the listener skips its own process's
RECONNECT_S = 1.0
# Woken waiters of one loop that try at once: one signal wakes them all, and the first (the
# longest waiting) should not queue its grant behind every other's try.
WOKEN_AT_ONCE = 8


class _LoopWaits:
    """One event loop's events, one per channel (replaced once set), and whether it closes."""

    def __init__(self) -> None:
        self.events: dict[str, asyncio.Event] = {}
        self.closing = False
        self.closed = asyncio.Event()  # set at shutdown: ends a pause that waits on other things
        self.turns = asyncio.Semaphore(WOKEN_AT_ONCE)

    def token(self, channel: str) -> asyncio.Event:
        found = self.events.get(channel)
        if found is None:
            found = self.events[channel] = asyncio.Event()
            if self.closing:
                found.set()
        return found

    def fire(self, channels: Iterable[str]) -> None:
        for channel in channels:
            found = self.events.pop(channel, None)
            if found is not None:
                found.set()

    def close(self) -> None:
        self.closing = True
        self.closed.set()
        self.fire(list(self.events))


class Notifier:
    """The process's waits: `token` on the waiter's loop, `notify` from any thread."""

    def __init__(self) -> None:
        self._loops: dict[asyncio.AbstractEventLoop, _LoopWaits] = {}
        self._lock = threading.Lock()
        self.notified = 0  # how many notify calls (tests)

    def _waits(self) -> _LoopWaits:
        loop = asyncio.get_running_loop()
        with self._lock:
            found = self._loops.get(loop)
            if found is None:
                for gone in [other for other in self._loops if other.is_closed()]:
                    del self._loops[gone]
                found = self._loops[loop] = _LoopWaits()
            return found

    def token(self, channel: str) -> asyncio.Event:
        """Set at the channel's next signal: take it before a try, wait on it after."""
        return self._waits().token(channel)

    def turn(self) -> asyncio.Semaphore:
        """Held by a woken waiter while it tries (WOKEN_AT_ONCE at a time, first come first)."""
        return self._waits().turns

    def closing(self) -> bool:
        """Whether this loop's server is shutting down: waits end at once."""
        return self._waits().closing

    def shutdown(self) -> asyncio.Event:
        """Set when this loop's server shuts down."""
        return self._waits().closed

    def open(self) -> None:
        """This loop serves (again): its waits wait (the app's lifespan start)."""
        waits = self._waits()
        waits.closing = False
        waits.closed = asyncio.Event()

    def close(self) -> None:
        """End every wait of this loop now, and any later one at once (shutdown)."""
        self._waits().close()

    def notify(self, *channels: str) -> None:
        """Wake the waiters of these channels on every loop; safe from any thread."""
        self.notified += 1
        with self._lock:
            loops = list(self._loops.items())
        for loop, waits in loops:
            try:
                loop.call_soon_threadsafe(waits.fire, channels)
            except RuntimeError:  # that loop closed meanwhile
                continue


WAKEUPS = Notifier()


def after_commit(session: Session, *channels: str) -> None:
    """Signal the channels once the session's transaction commits (nothing if it rolls back):
    in process at commit, and on Postgres by `pg_notify` in the transaction itself."""
    pending: set[str] | None = session.info.get(_PENDING)
    if pending is None:
        pending = session.info[_PENDING] = set()
        event.listen(session, "after_commit", _fire)
        event.listen(session, "after_rollback", _forget)
    new = set(channels) - pending
    pending |= new
    if new and session.get_bind().dialect.name == "postgresql":
        for channel in sorted(new):
            session.execute(select(func.pg_notify(channel, _ORIGIN)))


def _fire(session: Session) -> None:
    pending: set[str] = session.info[_PENDING]
    channels = sorted(pending)
    pending.clear()
    if channels:
        WAKEUPS.notify(*channels)


def _forget(session: Session) -> None:
    session.info[_PENDING].clear()


def notify_from(channel: str) -> Any:
    """A `pg_notify` of the channel as a FROM item, for a one-statement unit that signals
    (server/leases/statements.py): Postgres sends it when the statement commits."""
    return func.pg_notify(literal_column(f"'{channel}'"), literal_column(f"'{_ORIGIN}'")).alias(
        "notified"
    )


class Listener:
    """This app's one listening connection (Postgres): what other processes signal wakes this
    process's waiters. Reconnects after a failure; while it is down, waiters fall back to
    their poll, and every waiter is woken once it listens again (a signal may have been
    missed)."""

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._task: asyncio.Task[None] | None = None
        self.listening = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await self._listen()
            except Exception:  # whatever it was, listen again: until then waiters poll
                log.warning("wake-up listener: connection lost, reconnecting", exc_info=True)
            self.listening.clear()
            await asyncio.sleep(RECONNECT_S)

    async def _listen(self) -> None:
        conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
        async with conn:
            for channel in CHANNELS:
                await conn.execute(f"LISTEN {channel}")
            self.listening.set()
            WAKEUPS.notify(*CHANNELS)
            async for note in conn.notifies():
                if note.payload != _ORIGIN:
                    WAKEUPS.notify(note.channel)


def close_on_exit_signals() -> None:
    """At SIGINT/SIGTERM end this loop's waits at once, then let the handler installed before
    (uvicorn's: it starts the shutdown, which waits for open requests) run. Main thread only;
    uvicorn restores its own handlers when it stops serving."""
    if threading.current_thread() is not threading.main_thread():
        return
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        before = signal.getsignal(signum)
        if not callable(before):
            continue

        def chained(sig: int, frame: FrameType | None, before: Any = before) -> None:
            loop.call_soon_threadsafe(WAKEUPS.close)
            before(sig, frame)

        signal.signal(signum, chained)
