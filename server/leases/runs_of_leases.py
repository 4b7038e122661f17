"""lease id → run id, which never changes: a heartbeat needs its run's config (TTL, window)
before its one statement. Filled by this process's grants; a miss costs one lookup. Shared by
the request threads (a lock around each step)."""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from contextlib import AbstractContextManager

from sqlalchemy import select
from sqlalchemy.orm import Session

from server.models import Lease


class LeaseRuns:
    def __init__(self, max_size: int = 65536) -> None:
        self._runs: OrderedDict[uuid.UUID, uuid.UUID] = OrderedDict()
        self._max_size = max_size
        self._lock = threading.Lock()

    def remember(self, lease_id: uuid.UUID, run_id: uuid.UUID) -> None:
        with self._lock:
            self._runs[lease_id] = run_id
            if len(self._runs) > self._max_size:
                self._runs.popitem(last=False)

    def run_of(
        self, session_of: Callable[[], AbstractContextManager[Session]], lease_id: uuid.UUID
    ) -> uuid.UUID | None:
        """The lease's run, or None for no such lease."""
        with self._lock:
            run_id = self._runs.get(lease_id)
        if run_id is None:
            with session_of() as session:
                run_id = run_of_lease(session, lease_id)
            if run_id is not None:
                self.remember(lease_id, run_id)
        return run_id


def run_of_lease(session: Session, lease_id: uuid.UUID) -> uuid.UUID | None:
    return session.execute(select(Lease.run_id).where(Lease.id == lease_id)).scalar()


LEASE_RUNS = LeaseRuns()
