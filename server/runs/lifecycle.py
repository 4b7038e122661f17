"""The run lifecycle (docs/architecture/run-lifecycle.md, "Run lifecycle"): every status change of a
run goes through this module — the admin actions, the learner's attach, the final publish, the
budget job and the learner's failure report. Each is one compare-and-set on the run's status that
names the states it may start from, so two concurrent transitions never both apply."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import case, update
from sqlalchemy.orm import Session

from protocol.error_codes import ErrorCode
from protocol.schemas import RUN_STATUSES, TERMINAL_RUN_STATUSES, TRAIN_KIND
from server.db_types import db_now
from server.errors import Conflict, NotFound
from server.events.service import raise_event
from server.models import Run
from server.runs import repository
from server.wakeups import LEARNER, LEASES, after_commit

STATUSES = RUN_STATUSES
TERMINAL = TERMINAL_RUN_STATUSES
LIVE = frozenset(s for s in STATUSES if s not in TERMINAL)
RESUME = "running if a learner has attached before, else pending"

Actor = Literal["admin", "learner", "jobs"]


@dataclass(frozen=True)
class Transition:
    """Who makes it, the states it may start from, and where it leads (RESUME: `running` if a
    learner has attached before, else `pending`)."""

    actor: Actor
    from_states: frozenset[str]
    to_status: str


TRANSITIONS: dict[str, Transition] = {
    # A run on a stored dataset is created `preparing`; the run_prep job makes its prompt rows.
    "prepared": Transition("jobs", frozenset({"preparing"}), "pending"),
    "prepare_failed": Transition("jobs", frozenset({"preparing"}), "failed"),
    "attach": Transition("learner", frozenset({"pending"}), "running"),
    "pause": Transition("admin", frozenset({"pending", "running"}), "paused"),
    "resume": Transition("admin", frozenset({"paused", "budget_exhausted"}), RESUME),
    "cancel": Transition("admin", LIVE, "cancelled"),
    "budget": Transition("jobs", frozenset({"pending", "running", "paused"}), "budget_exhausted"),
    # the final version of a run with an eval block: training is over, its evals are not
    "evaluate": Transition("learner", LIVE - {"evaluating"}, "evaluating"),
    "complete": Transition("learner", LIVE, "completed"),
    # the run's early_stop rule, read when one of the learner's calls ranks a version
    # (server/runs/best.py): only a training run stops early
    "early_stop": Transition("learner", frozenset({"running"}), "completed"),
    "fail": Transition("learner", LIVE, "failed"),
}
# Closing a run's ledger (its unfinished prompt rows dropped, its unconsumed batches rejected,
# its active leases aborted; of one kind, or all when None) is the business of the lease
# engine and the learner, above runs in the feature order: the composition root hands the
# closer in (server/wiring.py).
LedgerCloser = Callable[[Session, uuid.UUID, str, "str | None"], None]
_ledger_closer: list[LedgerCloser] = []


def close_ledger_with(closer: LedgerCloser) -> None:
    _ledger_closer[:] = [closer]


def _close_ledger(session: Session, run_id: uuid.UUID, reason: str, kind: str | None) -> None:
    if not _ledger_closer:
        raise RuntimeError("no ledger closer: call server.wiring.wire() at start")
    _ledger_closer[0](session, run_id, reason, kind)


ADMIN_ACTIONS = tuple(name for name, t in TRANSITIONS.items() if t.actor == "admin")


def admin_actions_from(status: str) -> list[str]:
    """The admin actions a run in this status allows (what the dashboard offers)."""
    return [name for name in ADMIN_ACTIONS if status in TRANSITIONS[name].from_states]


def _target(transition: Transition) -> Any:
    if transition.to_status == RESUME:
        return case((Run.learner_attached_at.is_(None), "pending"), else_="running")
    return transition.to_status


def move(session: Session, run_id: uuid.UUID, name: str, reason: str | None, *where: Any) -> bool:
    """Apply the transition if the run is in one of its from-states (and `where` holds): one
    compare-and-set. False: the run was elsewhere (or absent) and nothing changed."""
    transition = TRANSITIONS[name]
    row = session.execute(
        update(Run)
        .where(Run.id == run_id, Run.status.in_(sorted(transition.from_states)), *where)
        .values(status=_target(transition), status_reason=reason, updated_at=db_now())
        .returning(Run.id)
        .execution_options(synchronize_session=False)
    ).first()
    if row is not None:  # a run leasing again, or one that stopped: its waiters look again
        after_commit(session, LEASES, LEARNER)
    return row is not None


def admin_action(session: Session, run_id: uuid.UUID, action: str, reason: str | None) -> Run:
    """pause / resume / cancel: the run after the move; 404 for an unknown run, 409 naming its
    status when the action is not allowed from it."""
    if action not in ADMIN_ACTIONS:
        raise ValueError(f"{action!r} is not an admin action")
    moved = move(session, run_id, action, reason)
    run = repository.get(session, run_id)
    if run is None:
        raise NotFound(f"run {run_id} not found", code=ErrorCode.run_not_found)
    if moved:
        raise_event(
            session,
            kind="run.status",
            severity="info",
            message=f"{action}: the run is {run.status}" + (f" ({reason})" if reason else ""),
            run_id=run_id,
            data={"action": action, "status": run.status},
        )
        return run
    allowed = ", ".join(sorted(TRANSITIONS[action].from_states))
    why = "it has ended" if run.status in TERMINAL else f"{action} needs one of: {allowed}"
    raise Conflict(
        f"cannot {action} a run that is {run.status}: {why}",
        status=run.status,
        action=action,
        code=ErrorCode.invalid_transition,
    )


def complete(session: Session, run_id: uuid.UUID, reason: str) -> None:
    """The run is completed and its ledger closed (invariant 12): leftover prompt rows dropped
    `run_completed`, unconsumed batches rejected, active leases aborted; nothing in flight."""
    if not move(session, run_id, "complete", reason):
        raise Conflict("the run has already ended", code=ErrorCode.run_ended)
    _close_ledger(session, run_id, "run_completed", None)


def stop_early(session: Session, run_id: uuid.UUID, reason: str) -> bool:
    """A running run whose early_stop rule holds: completed and its ledger closed as `complete`
    closes it. False when the run was no longer running (nothing changed)."""
    if not move(session, run_id, "early_stop", reason):
        return False
    _close_ledger(session, run_id, "run_completed", None)
    return True


def finish_training(session: Session, run_id: uuid.UUID, reason: str) -> None:
    """The final version of a run with an eval block is published: the run is `evaluating`
    and its training ledger closed as `complete` closes it (prompt rows dropped
    `run_completed`, unconsumed training batches rejected, active training leases aborted);
    the eval ledger stays open until every due version is scored (then `complete`)."""
    if not move(session, run_id, "evaluate", reason):
        raise Conflict("the run has already ended", code=ErrorCode.run_ended)
    _close_ledger(session, run_id, "run_completed", TRAIN_KIND)


def describe() -> str:
    """The transitions in one line each (the API's description of the admin routes)."""
    return "; ".join(
        f"{name} ({t.actor}): {', '.join(sorted(t.from_states))} → {t.to_status}"
        for name, t in TRANSITIONS.items()
    )
