"""The long-poll loop's pauses (server/long_poll.py; docs/architecture/protocol.md, "Waiting
without polling"), on an event loop of their own: a signal from another thread ends a pause on
its channel and the next try runs; a shutdown ends any pause, a channel's or a caller's own
(the version long-poll's), and the call answers its last try. Every wait here is 30 s, so the
10 s deadline on each only passes when the pause was ended early."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any

from server.long_poll import long_poll
from server.wakeups import LEASES, WAKEUPS

SETTINGS: Any = SimpleNamespace(
    lease_long_poll_s=30.0, long_poll_interval_s=30.0, long_poll_wakeups=True
)


def _waiting_call(pause: Any = None) -> tuple[list[int], asyncio.Event, Any]:
    tries: list[int] = []
    tried = asyncio.Event()

    async def attempt(_deadline: float) -> int:
        tries.append(len(tries) + 1)
        tried.set()
        return len(tries)

    call = long_poll(attempt, lambda n: n >= 2, 30.0, SETTINGS, LEASES, pause)
    return tries, tried, asyncio.ensure_future(call)


def test_a_signal_from_another_thread_ends_the_pause() -> None:
    async def main() -> int:
        WAKEUPS.open()
        _tries, tried, call = _waiting_call()
        await tried.wait()
        threading.Thread(target=WAKEUPS.notify, args=(LEASES,)).start()
        return int(await asyncio.wait_for(call, 10))

    assert asyncio.run(main()) == 2  # the second try, after the signal, is done


def test_shutdown_ends_a_channel_pause_with_the_last_answer() -> None:
    async def main() -> tuple[int, list[int]]:
        WAKEUPS.open()
        tries, tried, call = _waiting_call()
        await tried.wait()
        WAKEUPS.close()
        return int(await asyncio.wait_for(call, 10)), tries

    assert asyncio.run(main()) == (1, [1])  # no try after the shutdown


def test_shutdown_ends_a_pause_of_the_callers_own() -> None:
    async def forever(_result: int, _remaining: float) -> None:
        await asyncio.Event().wait()

    async def main() -> int:
        WAKEUPS.open()
        _tries, tried, call = _waiting_call(forever)
        await tried.wait()
        WAKEUPS.close()
        return int(await asyncio.wait_for(call, 10))

    assert asyncio.run(main()) == 1
