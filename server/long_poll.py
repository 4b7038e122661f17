"""The long-poll loop of every waiting call (lease acquire, batch and eval claims, version
notices): try, and while the answer is empty and the wait (the asked wait_s, capped by
`lease_long_poll_s`) is not over, pause on the event loop and try again. Nothing (thread,
connection, lock) is held between tries: each try is its own transaction."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

POLL_INTERVAL_S = 0.25  # between tries that poll the database


async def _sleep(_result: object, remaining: float) -> None:
    await asyncio.sleep(min(POLL_INTERVAL_S, remaining))


async def long_poll(
    attempt: Callable[[float], Awaitable[T]],
    done: Callable[[T], bool],
    wait_s: float,
    cap_s: float,
    pause: Callable[[T, float], Awaitable[None]] = _sleep,
) -> T:
    """The first try's answer that is `done`, else the last one's when the wait is over.
    `attempt` gets the deadline (monotonic time); `pause` gets the last answer and the seconds
    left (default: sleep POLL_INTERVAL_S, or less)."""
    deadline = time.monotonic() + min(wait_s, cap_s)
    while True:
        result = await attempt(deadline)
        remaining = deadline - time.monotonic()
        if done(result) or remaining <= 0:
            return result
        await pause(result, remaining)
