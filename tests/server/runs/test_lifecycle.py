"""The run lifecycle (docs/architecture/run-lifecycle.md, "Run lifecycle"): every transition of the
table from every status, completion closing the ledger, and no status change (nor admission-counter
change) written anywhere but in its one home."""

from __future__ import annotations

import ast
import re
import uuid
from pathlib import Path
from typing import Any, get_args

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from server.dashboard.router import Action
from server.db_types import db_now
from server.leases import queue
from server.models import Lease, PromptRow, Run
from server.runs import lifecycle
from tests.server.jobs.factories import acquire, add_batch, new_run, new_worker

SERVER = Path(__file__).resolve().parents[3] / "server"


def _set(session: Session, run_id: uuid.UUID, status: str, attached: bool) -> None:
    session.execute(
        update(Run)
        .where(Run.id == run_id)
        .values(status=status, learner_attached_at=db_now() if attached else None)
    )


def _status(session: Session, run_id: uuid.UUID) -> str:
    return str(session.execute(select(Run.status).where(Run.id == run_id)).scalar_one())


def test_every_transition_from_every_status(db_session: Session) -> None:
    run = new_run(db_session)
    for attached in (False, True):
        for name, transition in lifecycle.TRANSITIONS.items():
            for status in lifecycle.STATUSES:
                _set(db_session, run.id, status, attached)
                moved = lifecycle.move(db_session, run.id, name, f"{name} test")
                after = _status(db_session, run.id)
                if status not in transition.from_states:
                    assert (moved, after) == (False, status), (name, status)
                    continue
                expected = transition.to_status
                if expected == lifecycle.RESUME:
                    expected = "running" if attached else "pending"
                assert (moved, after) == (True, expected), (name, status)


def test_terminal_states_have_no_way_out_and_live_ones_can_end() -> None:
    for transition in lifecycle.TRANSITIONS.values():
        assert not transition.from_states & lifecycle.TERMINAL
    for status in lifecycle.LIVE:
        assert any(
            status in t.from_states and t.to_status in lifecycle.TERMINAL
            for t in lifecycle.TRANSITIONS.values()
        ), status


def test_the_dashboard_offers_exactly_the_admin_actions() -> None:
    assert set(get_args(Action)) == set(lifecycle.ADMIN_ACTIONS) == {"pause", "resume", "cancel"}


def _rows_in_flight(session: Session, run_id: uuid.UUID) -> int:
    return int(
        session.execute(
            select(func.count())
            .select_from(PromptRow)
            .where(PromptRow.run_id == run_id, PromptRow.state.in_(queue.IN_FLIGHT))
        ).scalar_one()
    )


def test_complete_closes_the_ledger(db_session: Session, app: Any) -> None:
    run = new_run(db_session, n_rows=8)
    worker = new_worker(db_session)
    store, settings = app.state.store, app.state.settings
    leased = acquire(db_session, store, settings, worker)
    accepted = acquire(db_session, store, settings, worker)
    assert leased is not None and accepted is not None
    rows = list(
        db_session.execute(select(PromptRow.id).where(PromptRow.lease_id == accepted)).scalars()
    )
    batch = add_batch(db_session, run, worker, accepted, state="accepted")
    db_session.execute(
        update(PromptRow).where(PromptRow.id.in_(rows)).values(state="accepted", batch_id=batch.id)
    )
    db_session.refresh(run)
    assert run.groups_in_flight == _rows_in_flight(db_session, run.id) == 4

    lifecycle.complete(db_session, run.id, "final version published")

    db_session.refresh(run)
    db_session.refresh(batch)
    assert (run.status, run.status_reason) == ("completed", "final version published")
    assert run.groups_in_flight == _rows_in_flight(db_session, run.id) == 0
    states = db_session.execute(
        select(PromptRow.state, PromptRow.drop_reason).where(PromptRow.run_id == run.id)
    ).all()
    assert set(states) == {("dropped", "run_completed")} and len(states) == 8
    assert (batch.state, batch.reject_reason) == ("rejected", "run_completed")
    lease = db_session.get(Lease, leased)
    assert lease is not None
    db_session.refresh(lease)
    assert (lease.state, lease.end_reason) == ("aborted", "run_completed")


def _value_keywords_on_runs(path: Path) -> set[str]:
    """Keywords of every `.values(…)` chained on an `update(Run)` in the file."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr != "values" or "update(Run)" not in ast.unparse(node.func.value):
            continue
        found |= {k.arg for k in node.keywords if k.arg}
    return found


def _raw_sql_sets(path: Path, column: str) -> bool:
    pattern = re.compile(rf"\b(UPDATE runs SET|,)\s*{column}\s*=", re.IGNORECASE)
    return any(
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and pattern.search(node.value)
        for node in ast.walk(ast.parse(path.read_text()))
    )


def test_status_and_admission_counter_have_one_writer_each() -> None:
    homes = {"status": SERVER / "runs" / "lifecycle.py"}
    homes["groups_in_flight"] = SERVER / "leases" / "queue.py"
    for column, home in homes.items():
        writers = {
            path.relative_to(SERVER).as_posix()
            for path in SERVER.rglob("*.py")
            if column in _value_keywords_on_runs(path) or _raw_sql_sets(path, column)
        }
        assert writers == {home.relative_to(SERVER).as_posix()}, (column, writers)
