"""The long-poll loop of every waiting call (lease acquire, batch and eval claims, version
notices): try, and while the answer is empty and the wait (the asked wait_s, capped by
`lease_long_poll_s`) is not over, pause on the event loop and try again. Nothing (thread,
connection, lock) is held between tries: each try is its own transaction.

The pause (docs/architecture/protocol.md, "Waiting without polling") lasts until the call's
wake-up channel is signalled (server/wakeups.py), or `long_poll_interval_s` at most: the
fallback poll. Woken waiters try a few at a time (`WAKEUPS.turn`), the longest waiting first.
When the pause ran out at the end of the wait, the last try's answer stands (the caller asks
again at once). A shutdown ends every pause at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from contextlib import nullcontext
from typing import TypeVar

from server.config import Settings
from server.wakeups import WAKEUPS

T = TypeVar("T")

Pause = Callable[[T, float], Awaitable[None]]


async def _woken(token: asyncio.Event, timeout_s: float) -> bool:
    """Whether the token was set within the timeout."""
    try:
        await asyncio.wait_for(token.wait(), timeout_s)
    except TimeoutError:
        return False
    return True


async def _unless_shutdown(pause: Awaitable[None]) -> None:
    """The pause, ended early by a shutdown."""
    paused = asyncio.ensure_future(pause)
    shutdown = asyncio.ensure_future(WAKEUPS.shutdown().wait())
    try:
        await asyncio.wait((paused, shutdown), return_when=asyncio.FIRST_COMPLETED)
    finally:
        shutdown.cancel()
        if not paused.done():
            paused.cancel()
        await asyncio.gather(paused, shutdown, return_exceptions=True)
    if not paused.cancelled():
        paused.result()  # the pause's own error, if any


async def long_poll(
    attempt: Callable[[float], Awaitable[T]],
    done: Callable[[T], bool],
    wait_s: float,
    settings: Settings,
    channel: str | None = None,
    pause: Pause[T] | None = None,
) -> T:
    """The first try's answer that is `done`, else the last one's when the wait is over.
    `attempt` gets the deadline (monotonic time). Between tries: `pause` (given the last
    answer and the seconds left) when given; else until `channel` is signalled (with
    `long_poll_wakeups` on) or `long_poll_interval_s` passed."""
    deadline = time.monotonic() + min(wait_s, settings.lease_long_poll_s)
    interval_s = settings.long_poll_interval_s
    listens = channel is not None and settings.long_poll_wakeups
    woken = False
    while True:
        # taken before the try: a signal while it runs ends the pause at once
        token = WAKEUPS.token(channel) if listens and channel is not None else WAKEUPS.shutdown()
        async with WAKEUPS.turn() if woken else nullcontext():
            result = await attempt(deadline)
        remaining = deadline - time.monotonic()
        if done(result) or remaining <= 0 or WAKEUPS.closing():
            return result
        if pause is not None:
            await _unless_shutdown(pause(result, remaining))
            if WAKEUPS.closing():
                return result
            continue
        pause_s = min(interval_s, remaining)
        woken = await _woken(token, pause_s)
        # A pause to the deadline that timed out ends the wait, whatever time.monotonic() says
        # now: uvloop's timers run on the loop's cached clock and may fire a little early.
        if WAKEUPS.closing() or (not woken and pause_s >= remaining):
            return result
