"""The prompt-row queue and the admission counter (contracts.md, "Prompt-row queue").

Prompt row states: queued -> leased -> accepted -> claimed -> consumed; leased, accepted and
claimed rows may go back to queued (re-queue, to the FRONT of the queue) or to dropped (after
max_attempts). `Run.groups_in_flight` counts rows in leased|accepted|claimed; every function
here keeps it exact in the same transaction as the row changes.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import Row, select, update
from sqlalchemy.orm import Session

from server.db_types import db_now
from server.models import PromptRow, Run
from server.runs import service as runs

IN_FLIGHT = ("leased", "accepted", "claimed")
# Reasons that do not count as an attempt (a worker's voluntary release).
FREE_REASONS = frozenset({"release", "released"})


@dataclass(frozen=True)
class RequeueResult:
    """Rows put back at the front of the queue, rows dropped, and the in-flight decrement."""

    requeued: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)

    @property
    def left_in_flight(self) -> int:
        return len(self.requeued) + len(self.dropped)


def requeue(
    session: Session,
    run_id: uuid.UUID,
    row_ids: Sequence[int],
    reason: str,
    *,
    count_attempt: bool,
) -> RequeueResult:
    """Put in-flight rows back at the front of the queue (their relative order kept).

    Clears lease_id/batch_id; increments attempts when `count_attempt`; drops rows whose
    attempts reached the run's max_attempts with drop_reason f"{reason}_exhausted"; decrements
    Run.groups_in_flight by the rows that left leased/accepted/claimed. Rows not in flight (or
    of another run) are ignored.
    """
    if not row_ids:
        return RequeueResult()
    rows = session.execute(
        select(PromptRow.id, PromptRow.attempts)
        .where(
            PromptRow.run_id == run_id,
            PromptRow.id.in_(list(row_ids)),
            PromptRow.state.in_(IN_FLIGHT),
        )
        .order_by(PromptRow.queue_pos, PromptRow.id)
        .with_for_update()
    ).all()
    if not rows:
        return RequeueResult()
    limit = runs.config_of(session, run_id).max_attempts
    bump = 1 if count_attempt else 0
    back = [r for r in rows if not (count_attempt and r.attempts + bump >= limit)]
    gone = [r for r in rows if r not in back]
    head = session.execute(
        update(Run)
        .where(Run.id == run_id)
        .values(
            queue_head=Run.queue_head - len(back),
            groups_in_flight=Run.groups_in_flight - len(rows),
        )
        .returning(Run.queue_head)
    ).scalar_one()
    params = [
        {
            "id": r.id,
            "state": "queued",
            "queue_pos": head + i,
            "attempts": r.attempts + bump,
            "lease_id": None,
            "batch_id": None,
            "last_requeue_reason": reason,
        }
        for i, r in enumerate(back)
    ] + [
        {
            "id": r.id,
            "state": "dropped",
            "attempts": r.attempts + bump,
            "lease_id": None,
            "batch_id": None,
            "last_requeue_reason": reason,
            "drop_reason": f"{reason}_exhausted",
        }
        for r in gone
    ]
    _bulk_update(session, params)
    return RequeueResult(requeued=[r.id for r in back], dropped=[r.id for r in gone])


def _bulk_update(session: Session, params: list[dict[str, object]]) -> None:
    """Per-row updates by primary key, grouped by the set of columns they change."""
    groups: dict[tuple[str, ...], list[dict[str, object]]] = {}
    for p in params:
        groups.setdefault(tuple(sorted(p)), []).append(p)
    for rows in groups.values():
        session.execute(update(PromptRow).execution_options(synchronize_session=False), rows)


def consume(
    session: Session, run_id: uuid.UUID, batch_ids: Sequence[uuid.UUID], version: int
) -> int:
    """Mark the batches' accepted/claimed rows consumed in `version`; returns how many rows.

    Decrements Run.groups_in_flight by that number in the same transaction.
    """
    if not batch_ids:
        return 0
    consumed = session.execute(
        update(PromptRow)
        .where(
            PromptRow.run_id == run_id,
            PromptRow.batch_id.in_(list(batch_ids)),
            PromptRow.state.in_(("accepted", "claimed")),
        )
        .values(state="consumed", consumed_version=version)
        .returning(PromptRow.id)
        .execution_options(synchronize_session=False)
    ).all()
    if consumed:
        session.execute(
            update(Run)
            .where(Run.id == run_id)
            .values(groups_in_flight=Run.groups_in_flight - len(consumed))
        )
    return len(consumed)


def admit(
    session: Session, run_id: uuid.UUID, n: int, bound: int
) -> Row[int, int, str | None] | None:
    """The admission compare-and-set, taking the grant's fencing token in the same statement.

    `UPDATE runs SET groups_in_flight = groups_in_flight + n, fencing_seq = fencing_seq + 1,
    last_lease_at = now() WHERE id = :id AND status = 'running' AND groups_in_flight + n <=
    :bound RETURNING fencing_seq, current_version, tokenizer_fingerprint`; None when the bound
    (or the status) refuses — never count-then-insert.
    """
    return session.execute(
        update(Run)
        .where(Run.id == run_id, Run.status == "running", Run.groups_in_flight + n <= bound)
        .values(
            groups_in_flight=Run.groups_in_flight + n,
            fencing_seq=Run.fencing_seq + 1,
            last_lease_at=db_now(),
        )
        .returning(Run.fencing_seq, Run.current_version, Run.tokenizer_fingerprint)
        .execution_options(synchronize_session=False)
    ).first()


def next_fencing(session: Session, run_id: uuid.UUID) -> int:
    """A strictly higher fencing token for any grant on the run (worker lease or learner)."""
    return int(
        session.execute(
            update(Run)
            .where(Run.id == run_id)
            .values(fencing_seq=Run.fencing_seq + 1)
            .returning(Run.fencing_seq)
        ).scalar_one()
    )


def rows_of_lease(session: Session, lease_id: uuid.UUID) -> list[int]:
    return list(
        session.execute(
            select(PromptRow.id).where(PromptRow.lease_id == lease_id).order_by(PromptRow.queue_pos)
        ).scalars()
    )


def rows_of_batches(session: Session, batch_ids: Sequence[uuid.UUID]) -> list[int]:
    if not batch_ids:
        return []
    return list(
        session.execute(
            select(PromptRow.id)
            .where(PromptRow.batch_id.in_(list(batch_ids)))
            .order_by(PromptRow.queue_pos)
        ).scalars()
    )
