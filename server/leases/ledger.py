"""The work ledger's kinds by name (server/leases/kinds.py), and the grant order they make.

Training is the lease engine's own kind; eval's (server/evals/ledger.py) sits above leases in
the feature order and is registered by the composition root (server/wiring.py) before the
first call: an unknown kind raises rather than being skipped."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from sqlalchemy import ColumnElement, and_, bindparam, case, null, select
from sqlalchemy.orm import Session

from protocol.run_config import RunConfig
from protocol.schemas import LEASING_RUN_STATUSES
from server.leases.kinds import WorkKind
from server.leases.train import TRAIN
from server.models import Lease, RolloutBatch, Run

KINDS: dict[str, WorkKind] = {TRAIN.name: TRAIN}


def register(kind: WorkKind) -> None:
    """Add a kind to the ledger (idempotent)."""
    KINDS[kind.name] = kind


def kind_of(name: str) -> WorkKind:
    kind = KINDS.get(name)
    if kind is None:
        raise LookupError(f"no work kind {name!r} is registered (server/wiring.py wire())")
    return kind


def of_kind(kind_column: Any, kind: WorkKind | str) -> ColumnElement[bool]:
    """Every kind test in SQL: the rows (leases, batches) of this kind, by its `kind` column.
    A kind named by a string must be registered (kind_of raises): a misspelt kind is an error,
    never a test that matches nothing."""
    return kind_column == (kind_of(kind) if isinstance(kind, str) else kind).name  # type: ignore[no-any-return]


def trained(kind_column: Any) -> ColumnElement[bool]:
    """The rows of the kinds the learner trains on (`WorkKind.trained`: training's batches,
    never eval's): its claims, the trajectory viewer's latest batch, the stale waste."""
    return kind_column.in_(sorted(k.name for k in KINDS.values() if k.trained))  # type: ignore[no-any-return]


def claim_page(
    session: Session, run_id: uuid.UUID, limit: int, *, trained: bool
) -> list[RolloutBatch]:
    """The learner's claims, of either kind, take their batches here: the run's accepted
    batches of the kinds it trains on (`trained`, the training claim) or of those it scores
    (the eval claim), oldest adapter version first, locked (SKIP LOCKED on Postgres)."""
    names = sorted(k.name for k in KINDS.values() if k.trained is trained)
    return list(
        session.execute(
            select(RolloutBatch)
            .where(
                RolloutBatch.run_id == run_id,
                RolloutBatch.state == "accepted",
                RolloutBatch.kind.in_(names),
            )
            .order_by(RolloutBatch.adapter_version, RolloutBatch.created_at, RolloutBatch.id)
            .limit(limit)
            .with_for_update(skip_locked=True)
            .execution_options(populate_existing=True)
        ).scalars()
    )


def is_of(name: str, kind: WorkKind) -> bool:
    """Every kind test in Python: whether the kind stored as `name` is this kind."""
    return KINDS.get(name) is kind


def grant_order(config: RunConfig, run_status: str, fencing_seq: int) -> list[WorkKind]:
    """The kinds a grant of this run tries, in turn: those the run offers, a kind whose turn it
    is (eval's every EVAL_TURN-th grant) first, then in ledger order."""
    offered = [kind for kind in KINDS.values() if kind.offered(config, run_status)]
    return sorted(offered, key=lambda kind: not kind.goes_first(fencing_seq))


def _stopped(run_status: Any) -> ColumnElement[bool]:
    """The run left the leasing statuses (spelt out: the heartbeat's statement is compiled once,
    without an expanding IN)."""
    return and_(*(run_status != status for status in LEASING_RUN_STATUSES))


def abort_reason(kinds: Iterable[WorkKind] | None = None) -> ColumnElement[Any]:
    """Why a heartbeat aborts a held lease, by its kind (NULL: it does not), over the lease and
    run columns and the run's `admission` and `max_staleness` bound as parameters: a branch
    for each of `kinds` (every registered kind when None). A lease of a kind without a branch
    gets the rule no kind escapes: `run_<status>` once the run leaves the leasing statuses."""
    admission: Any = bindparam("admission")
    max_staleness: Any = bindparam("max_staleness")
    return case(
        *(
            (
                Lease.kind == kind.name,
                kind.abort_reason(
                    Run.status, Run.current_version, Lease.adapter_version, admission, max_staleness
                ),
            )
            for kind in (KINDS.values() if kinds is None else kinds)
        ),
        else_=case((_stopped(Run.status), "run_" + Run.status), else_=null()),
    )
