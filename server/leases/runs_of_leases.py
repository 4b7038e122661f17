"""lease id → (run id, kind), which never change: a heartbeat needs its run's config (TTL,
window) before its one statement, and complete's common case its batch key and kind. Filled by
this process's grants; a miss costs one lookup (`run_of`) or the general steps (`known`)."""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict

from sqlalchemy import bindparam, select

from server.leases.units import Statement, WorkerDb
from server.models import Lease

_RUN_OF_LEASE = Statement.of(
    select(Lease.run_id, Lease.kind).where(Lease.id == bindparam("lease_id"))
)


class LeaseRuns:
    def __init__(self, max_size: int = 65536) -> None:
        self._runs: OrderedDict[uuid.UUID, tuple[uuid.UUID, str]] = OrderedDict()
        self._max_size = max_size
        self._lock = threading.Lock()  # the app may run in several event loops (tests)

    def remember(self, lease_id: uuid.UUID, run_id: uuid.UUID, kind: str) -> None:
        with self._lock:
            self._runs[lease_id] = (run_id, kind)
            if len(self._runs) > self._max_size:
                self._runs.popitem(last=False)

    def known(self, lease_id: uuid.UUID) -> tuple[uuid.UUID, str] | None:
        """The lease's (run, kind) if this process knows it, without the database."""
        with self._lock:
            return self._runs.get(lease_id)

    async def run_of(self, db: WorkerDb, lease_id: uuid.UUID) -> uuid.UUID | None:
        """The lease's run, or None for no such lease."""
        known = self.known(lease_id)
        if known is None:
            row = await db.first(_RUN_OF_LEASE, {"lease_id": lease_id})
            if row is None:
                return None
            known = (row.run_id, row.kind)
            self.remember(lease_id, *known)
        return known[0]


LEASE_RUNS = LeaseRuns()
