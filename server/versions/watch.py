"""One watch of the running runs' versions per server process (docs/architecture/protocol.md,
"Version long-poll").

Workers long-poll GET /api/v1/versions to preload a run's new adapter version before a lease
needs it. A thousand of them waiting on one process must not cost a query each per tick: one
task reads `(id, base_model, project_id, current_version)` of the running runs every
`version_poll_s`, and only while somebody waits or asked recently; it wakes every waiter when
a run's version changed. A publish committed in this process pokes it (`poke`, from any
thread), so it reads again at once. With several server processes each has its own watch;
every answer still comes from the database, at most one tick old.

A version is known once its adapter row is read (its sha256 and files: immutable, read once
per version); a run whose current version has no adapter row yet is left out until it has one.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from server.versions.repository import Adapter, RunRow

log = logging.getLogger(__name__)

LINGER_S = 5.0  # keep watching this long after the last ask: workers ask again at once


@dataclass(frozen=True)
class RunVersion:
    """A running run's current version, with its adapter row (None for version 0)."""

    base_model: str
    project_id: uuid.UUID
    version: int
    adapter: Adapter | None


ReadRuns = Callable[[], Awaitable[list[RunRow]]]
ReadAdapter = Callable[[uuid.UUID, int], Awaitable[Adapter | None]]


class VersionWatch:
    """The running runs' versions, refreshed while wanted, and an event per change."""

    def __init__(self, read_runs: ReadRuns, read_adapter: ReadAdapter, poll_s: float) -> None:
        self._read_runs = read_runs
        self._read_adapter = read_adapter
        self._poll_s = poll_s
        self._runs: dict[uuid.UUID, RunVersion] = {}
        self._read_at = float("-inf")
        self._wanted_until = 0.0
        self._changed: asyncio.Event | None = None
        self._poked: asyncio.Event | None = None
        self._lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self.reads = 0  # how many times the runs were read (tests, /metrics-style checks)

    # -- what requests use --------------------------------------------------------------------

    async def current(self, *, wanted_until: float | None = None) -> dict[uuid.UUID, RunVersion]:
        """The running runs' versions, at most about one tick old; keeps the watch running
        until `wanted_until` (monotonic), or a little while."""
        self._want(max(wanted_until or 0.0, time.monotonic() + LINGER_S))
        if time.monotonic() - self._read_at > 2 * self._poll_s:
            await self._refresh(max_age_s=self._poll_s)
        return self._runs

    def change(self) -> asyncio.Event:
        """Set at the next change of any run's version: take it before reading `current`'s
        answer, then wait on it."""
        self._start()
        assert self._changed is not None
        return self._changed

    def poke(self) -> None:
        """Read again now (a publish committed in this process); safe from any thread."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self._set_poked)
        except RuntimeError:  # the loop closed meanwhile
            return

    async def close(self) -> None:
        task = self._task
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._task = None

    # -- the one task -------------------------------------------------------------------------

    def _start(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._changed = asyncio.Event()
            self._poked = asyncio.Event()
            self._lock = asyncio.Lock()

    def _want(self, until: float) -> None:
        self._start()
        self._wanted_until = max(self._wanted_until, until)
        if self._task is None or self._task.done():
            assert self._loop is not None
            self._task = self._loop.create_task(self._watch())

    def _set_poked(self) -> None:
        if self._poked is not None:
            self._poked.set()

    async def _watch(self) -> None:
        assert self._poked is not None
        while time.monotonic() < self._wanted_until:
            try:
                await asyncio.wait_for(self._poked.wait(), self._poll_s)
            except TimeoutError:
                pass
            self._poked.clear()
            try:
                await self._refresh(max_age_s=0.0)
            except Exception:  # an outage: the requests that read answer 503; keep watching
                log.warning("version watch: reading the runs failed", exc_info=True)

    async def _refresh(self, *, max_age_s: float) -> None:
        assert self._lock is not None
        async with self._lock:
            if time.monotonic() - self._read_at <= max_age_s:
                return  # another reader just did
            started = time.monotonic()
            rows = await self._read_runs()
            self.reads += 1
            runs: dict[uuid.UUID, RunVersion] = {}
            for run_id, base_model, project_id, version in rows:
                known = await self._known(run_id, base_model, project_id, version)
                if known is not None:
                    runs[run_id] = known
            changed = runs != self._runs
            self._runs = runs
            self._read_at = started
            if changed:
                self._wake()

    async def _known(
        self, run_id: uuid.UUID, base_model: str, project_id: uuid.UUID, version: int
    ) -> RunVersion | None:
        known = self._runs.get(run_id)
        if known is not None and known.version == version:
            return known
        if version == 0:
            return RunVersion(base_model, project_id, 0, None)
        adapter = await self._read_adapter(run_id, version)
        return None if adapter is None else RunVersion(base_model, project_id, version, adapter)

    def _wake(self) -> None:
        assert self._changed is not None
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
