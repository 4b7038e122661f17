"""The three ways a server answers the worker calls, as one test parameter, and the check that a
test on `pg-event-loop` really had its common case answered on the event loop.

- pg-event-loop: Postgres, the common case on the event loop (server/leases/fast_service.py),
  everything else handed to the portable path;
- pg-portable: Postgres with `worker_calls_on_event_loop` off: every call on the portable path;
- sqlite: SQLite, where every call takes the portable path.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from server.config import Settings
from server.leases.paths import EVENT_LOOP, PORTABLE
from tests.conftest import make_settings

PG_EVENT_LOOP = "pg-event-loop"
PG_PORTABLE = "pg-portable"
SQLITE = "sqlite"

POSTGRES_PATHS = [
    pytest.param(PG_EVENT_LOOP, marks=pytest.mark.postgres),
    pytest.param(PG_PORTABLE, marks=pytest.mark.postgres),
]
ALL_PATHS = [*POSTGRES_PATHS, SQLITE]


@dataclass(frozen=True)
class LeasePath:
    """One of the three paths (the parameter's name) on its fresh database."""

    name: str
    database_url: str

    @property
    def on_event_loop(self) -> bool:
        return self.name == PG_EVENT_LOOP

    @property
    def event_loop_path(self) -> str:
        """What call_paths counts a call under that pg-event-loop answers on the event loop."""
        return EVENT_LOOP if self.on_event_loop else PORTABLE

    def settings(self, bucket_dir: Path, **overrides: Any) -> Settings:
        settings: Settings = make_settings(
            self.database_url,
            bucket_dir,
            worker_calls_on_event_loop=self.on_event_loop,
            **overrides,
        )
        return settings


class Answered:
    """Which path answered an app's worker calls (app.state.call_paths, counted by
    server/leases/paths.py), against what the test's lease path promises."""

    def __init__(self, call_paths: Mapping[tuple[str, str], int], lease_path: LeasePath) -> None:
        self._call_paths = call_paths
        self._lease_path = lease_path

    def expect(
        self,
        *,
        on_event_loop: Mapping[str, int] | None = None,
        handed_over: Mapping[str, int] | None = None,
    ) -> None:
        """Exactly these answers, by call: `on_event_loop`, those pg-event-loop answers on the
        event loop (the common case, and a missing or malformed bearer token refused before any
        query), counted there on pg-event-loop and portable elsewhere; `handed_over`, those it
        hands to the portable path, portable everywhere. (Calls refused by request validation
        reach no path and are not counted.)"""
        expected: Counter[tuple[str, str]] = Counter()
        for call, n in (on_event_loop or {}).items():
            expected[(call, self._lease_path.event_loop_path)] += n
        for call, n in (handed_over or {}).items():
            expected[(call, PORTABLE)] += n
        assert +Counter(self._call_paths) == +expected, self._lease_path.name

    def check_the_path_held(self) -> None:
        """On pg-event-loop, a test that made worker calls had some answered on the event loop
        (the parameter did not quietly run everything on the portable path); on the other two,
        none was."""
        answered = sum(self._call_paths.values())
        on_event_loop = sum(n for (_, path), n in self._call_paths.items() if path == EVENT_LOOP)
        if self._lease_path.on_event_loop:
            assert on_event_loop > 0 or answered == 0, dict(self._call_paths)
        else:
            assert on_event_loop == 0, dict(self._call_paths)
