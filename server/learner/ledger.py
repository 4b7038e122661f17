"""The per-run prompt ledger (invariant 12): every prompt row of every epoch ends consumed once
(in a named version) or dropped with a reason."""

from __future__ import annotations

import uuid
from collections import defaultdict

from sqlalchemy.orm import Session

from protocol.error_codes import ErrorCode
from server.errors import NotFound
from server.learner import repository as repo
from server.learner.schemas import EpochLedger, Ledger

FINAL_STATES = ("consumed", "dropped")


def ledger_model(session: Session, run_id: uuid.UUID) -> Ledger:
    run = repo.get_run(session, run_id)
    if run is None:
        raise NotFound("run not found", code=ErrorCode.run_not_found)
    by_state: dict[str, int] = defaultdict(int)
    dropped: dict[str, int] = defaultdict(int)
    epochs: dict[int, tuple[dict[str, int], dict[str, int]]] = {}
    for epoch, state, drop_reason, n in repo.row_counts(session, run_id):
        e_states, e_dropped = epochs.setdefault(epoch, (defaultdict(int), defaultdict(int)))
        by_state[state] += n
        e_states[state] += n
        if state == "dropped":
            dropped[drop_reason or "unknown"] += n
            e_dropped[drop_reason or "unknown"] += n
    per_epoch = [
        EpochLedger(
            epoch=epoch,
            total=sum(states.values()),
            by_state=dict(states),
            dropped_by_reason=dict(drops),
            closed=_closed(states),
        )
        for epoch, (states, drops) in sorted(epochs.items())
    ]
    missing_version = repo.consumed_without_version(session, run_id)
    return Ledger(
        run_id=run_id,
        run_status=run.status,
        total=sum(by_state.values()),
        by_state=dict(by_state),
        dropped_by_reason=dict(dropped),
        epochs=per_epoch,
        consumed_without_version=missing_version,
        balanced=_closed(by_state) and missing_version == 0,
    )


def _closed(states: dict[str, int]) -> bool:
    return all(state in FINAL_STATES for state, n in states.items() if n)
