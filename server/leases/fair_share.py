"""Fair share of a run's admission bound (docs/architecture/lease-engine.md, "Fair share", invariant
25).

When several workers contend for one run, one worker may not hold more than its share of the
run's bound: fair_share = ceil(bound / contenders), and a grant is refused when the run's
prompt rows in flight through the worker's leases (leased, accepted or claimed: the bound's own
count) plus this lease's would exceed max(fair_share, one lease). Counting only the rows still
leased would let a fast worker whose batches wait for the learner take every slot the learner
frees, and starve a slower one. The contenders are the acquiring worker, the active workers serving
the run's base model and its project (server/projects/fleet.py: the run's project's workers and
the shared fleet, invariant 28) that hold an active lease of it, and those that are waiting
(`workers.waiting_since` set by an acquire try that granted nothing, and seen recently).

The contenders are a read before the grant (a soft rule: they may change under it); the
worker's held count is checked in the grant statement itself (`queue.admit`, `queue.GRANT`,
parameter `worker_cap`). The read is made only when the share can matter for this try: with
admission control on, when the grant would take the run's groups in flight past half its bound
but not past the bound (which refuses it anyway). Below half the bound no worker is capped: a
worker may take up to half the bound however many contend, the share holds above it.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import Float, Select, String, bindparam, exists, func, or_, select

from protocol.schemas import INT_MAX
from server.db_types import db_now_plus, json_has
from server.leases.units import Statement, WorkerDb
from server.models import Lease, Run, Worker
from server.projects.fleet import serves

NO_CAP = INT_MAX  # admission control off, or the share cannot matter for this try
MIN_WAITING_WINDOW_S = 5.0


def waiting_window_s(long_poll_s: float) -> float:
    """A waiting worker counts while it was seen this recently: twice the long-poll (a
    long-polling worker is seen at every try, and tries at least every
    min(long_poll_interval_s, long-poll) when nothing wakes it: server/long_poll.py), and never
    under a few seconds (round trips)."""
    return max(2 * long_poll_s, MIN_WAITING_WINDOW_S)


def needed(bound: int, in_flight: int, n: int) -> bool:
    """Whether the share can matter: the grant takes the run past half its bound, within it."""
    return bound < INT_MAX and bound < 2 * (in_flight + n) and in_flight + n <= bound


def worker_cap(bound: int, n: int, contenders: int) -> int:
    """The most prompt rows of the run one worker may hold: its share, at least one lease."""
    return max(-(-bound // max(contenders, 1)), n)


def _contenders() -> Select[Any]:
    """The other contenders of the run (the acquiring worker excluded): one expression, compiled
    for Postgres (jsonb's `?`) and SQLite (json_each) alike."""
    holds = exists().where(
        Lease.worker_id == Worker.id,
        Lease.run_id == bindparam("run_id"),
        Lease.state == "active",
    )
    project = select(Run.project_id).where(Run.id == bindparam("run_id")).scalar_subquery()
    waiting = Worker.waiting_since.is_not(None) & (
        Worker.last_seen_at > db_now_plus(-bindparam("window_s", type_=Float))
    )
    return (
        select(func.count())
        .select_from(Worker)
        .where(
            Worker.status == "active",
            Worker.id != bindparam("worker_id"),
            json_has(Worker.models, bindparam("base_model", type_=String)),
            serves(Worker.project_id, project),
            or_(holds, waiting),
        )
    )


_CONTENDERS = Statement.of(_contenders())


def _params(
    run_id: uuid.UUID, base_model: str, worker_id: uuid.UUID, window_s: float
) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "base_model": base_model,
        "worker_id": worker_id,
        "window_s": window_s,
    }


async def cap(
    db: WorkerDb,
    *,
    run_id: uuid.UUID,
    base_model: str,
    worker_id: uuid.UUID,
    bound: int,
    in_flight: int,
    n: int,
    window_s: float,
) -> int:
    """The grant's `worker_cap`: its own one-statement unit, a read before the grant."""
    if not needed(bound, in_flight, n):
        return NO_CAP
    row = await db.first(_CONTENDERS, _params(run_id, base_model, worker_id, window_s))
    return worker_cap(bound, n, 1 + int(row[0] if row else 0))
