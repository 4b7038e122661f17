"""The work ledger's kinds (docs/architecture/lease-engine.md, "The work ledger"): rollout work and
eval work are two kinds of one ledger — a row is leased, its lease ends in a batch, the batch is
claimed and consumed — and the lease engine (service.py, fenced.py, expiry.py) asks the lease's
kind, never tests it. A kind says which rows a grant takes and under which bound, how a lease's
sampling reads, when a heartbeat aborts it, where its rows go when it ends or its batch is accepted
or rejected, and which versions retention must keep for it. `ledger.KINDS` holds them by the name
stored on leases and batches."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, Protocol

from sqlalchemy import ColumnElement
from sqlalchemy.orm import Session

from protocol.run_config import RunConfig
from server.leases.queue import Granted
from server.leases.units import WorkerDb


class WorkKind(Protocol):
    """One kind of work in the ledger."""

    name: str
    trained: bool  # the learner trains on its batches (server/leases/ledger.py trained)

    def offered(self, config: RunConfig, run_status: str) -> bool:
        """Whether a run in this status, with this config, hands out this kind's leases."""
        ...

    def goes_first(self, fencing_seq: int) -> bool:
        """Whether the run's next grant offers this kind before the others."""
        ...

    async def grant(
        self,
        db: WorkerDb,
        run: Any,
        worker_id: uuid.UUID,
        lease_id: uuid.UUID,
        config: RunConfig,
        waiting_window_s: float,
    ) -> Granted | None:
        """Lease this kind's next rows of the run to the worker, its bound permitting, the
        worker's `waiting` cleared; None changes nothing. `run`: its id, base_model and
        groups_in_flight as the try read them; `waiting_window_s`: fair_share's window."""
        ...

    def sampling(self, config: RunConfig) -> tuple[dict[str, Any], int]:
        """A lease's sampling and group size."""
        ...

    def abort_reason(
        self,
        run_status: Any,
        current_version: Any,
        adapter_version: Any,
        admission: Any,
        max_staleness: Any,
    ) -> ColumnElement[Any]:
        """Why a heartbeat aborts a held lease of this kind (SQL; NULL: it does not)."""
        ...

    def counts_abort(self, reason: str) -> bool:
        """Whether a heartbeat abort for this reason counts an attempt of the rows."""
        ...

    def requeue(
        self,
        session: Session,
        run_id: uuid.UUID,
        lease_ids: Sequence[uuid.UUID],
        reason: str,
        *,
        count_attempt: bool,
        only: Sequence[int] | None = None,
    ) -> int:
        """The rows still out under these ended leases back to the front of their queue
        (`only`: just these rows, the others back without an attempt). How many."""
        ...

    def retained_versions(self, run_id: uuid.UUID) -> Any:
        """Retention (invariant 13): a select of the adapter versions this kind still needs
        beyond those its active leases and unconsumed batches name, or None for none."""
        ...

    def requeue_batch(
        self, session: Session, run_id: uuid.UUID, batch_id: uuid.UUID, reason: str
    ) -> tuple[int, int]:
        """A claimed batch the learner rejected: its rows back to the front of their queue, an
        attempt counted. How many went back, and how many were dropped (attempts used up)."""
        ...

    async def accept_held(
        self, db: WorkerDb, digest: str, lease_id: uuid.UUID, fencing: int, values: dict[str, Any]
    ) -> uuid.UUID | None:
        """complete's common case in one statement, where the kind has one: end the lease the
        authenticated worker holds `completed` and accept its batch. The batch id, or None
        (nothing changed: `complete` then takes the steps)."""
        ...

    async def complete(
        self,
        db: WorkerDb,
        lease: Any,
        fencing: int,
        values: dict[str, Any],
        reject: str | None,
    ) -> tuple[uuid.UUID, str | None] | None:
        """End the held lease `completed` (the fenced compare-and-set) with its batch row, in
        one unit:
        accepted, or rejected with its rows re-queued; the worker's counter raised. The batch id
        and the reject reason, or None when the fence refused (nothing changed)."""
        ...
