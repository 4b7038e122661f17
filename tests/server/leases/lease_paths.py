"""The lease tests' database, as one test parameter: every test that goes through the app runs
once on Postgres and once on SQLite, against the one lease engine (server/leases/), and can
check which worker calls the app answered (app.state.worker_calls)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from server.config import Settings
from tests.conftest import make_settings

POSTGRES = "postgres"
SQLITE = "sqlite"

ALL_PATHS = [pytest.param(POSTGRES, marks=pytest.mark.postgres), SQLITE]


@dataclass(frozen=True)
class LeasePath:
    """One database (the parameter's name) on its fresh migrated database."""

    name: str
    database_url: str

    def settings(self, bucket_dir: Path, **overrides: Any) -> Settings:
        settings: Settings = make_settings(self.database_url, bucket_dir, **overrides)
        return settings


class Answered:
    """The worker calls an app answered, by call (app.state.worker_calls)."""

    def __init__(self, calls: Mapping[str, int], lease_path: LeasePath) -> None:
        self._calls = calls
        self._lease_path = lease_path

    def expect(self, calls: Mapping[str, int]) -> None:
        """Exactly these answers (refused ones included), by call; calls refused by request
        validation or for a missing bearer token reach no call and are not counted."""
        assert +Counter(self._calls) == +Counter(calls), self._lease_path.name
