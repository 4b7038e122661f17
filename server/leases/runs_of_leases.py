"""lease id → run id, which never changes: a heartbeat needs its run's config (TTL, window)
before its one statement. Filled by this process's grants; a miss costs one lookup."""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict

from sqlalchemy import bindparam, select

from server.leases.units import Statement, WorkerDb
from server.models import Lease

_RUN_OF_LEASE = Statement.of(select(Lease.run_id).where(Lease.id == bindparam("lease_id")))


class LeaseRuns:
    def __init__(self, max_size: int = 65536) -> None:
        self._runs: OrderedDict[uuid.UUID, uuid.UUID] = OrderedDict()
        self._max_size = max_size
        self._lock = threading.Lock()  # the app may run in several event loops (tests)

    def remember(self, lease_id: uuid.UUID, run_id: uuid.UUID) -> None:
        with self._lock:
            self._runs[lease_id] = run_id
            if len(self._runs) > self._max_size:
                self._runs.popitem(last=False)

    async def run_of(self, db: WorkerDb, lease_id: uuid.UUID) -> uuid.UUID | None:
        """The lease's run, or None for no such lease."""
        with self._lock:
            run_id = self._runs.get(lease_id)
        if run_id is None:
            row = await db.first(_RUN_OF_LEASE, {"lease_id": lease_id})
            if row is None:
                return None
            run_id = row.run_id
            self.remember(lease_id, run_id)
        return run_id


LEASE_RUNS = LeaseRuns()
