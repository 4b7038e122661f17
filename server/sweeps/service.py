"""Sweep rules (docs/guides/sweeps.md): a sweep's combinations are expanded and every one
validated as a run config before any run is made (server/sweeps/expand.py); then the sweep row
and all its runs are made in the request's one transaction, each through the runs feature's
own creation (server/runs/service.py create_run: its rows, its learner token) tagged with the
sweep. A sweep's pause / resume / cancel applies the run lifecycle's admin action to each run
(server/runs/lifecycle.py admin_action); a run whose status does not allow it is reported and
left as it was, and the others still move."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy.orm import Session

from protocol.error_codes import ErrorCode
from protocol.outbound import OutboundPolicy
from server.errors import Conflict, NotFound, Unprocessable
from server.models import Run, Sweep
from server.projects import service as projects
from server.runs import figures, lifecycle
from server.runs import service as runs
from server.runs.waste import stale_waste
from server.sweeps import expand, repository
from server.sweeps.schemas import (
    RunActionOutcome,
    SweepActionResult,
    SweepCreate,
    SweepCreated,
    SweepDetail,
    SweepOut,
    SweepRun,
    SweepRunToken,
)
from server.tokens.access import Caller


def create_sweep(
    session: Session, body: SweepCreate, max_runs: int, policy: OutboundPolicy, caller: Caller
) -> tuple[SweepCreated, bool]:
    """The sweep and its runs (all or none), created by the caller's token in a project within
    its reach, and whether a run is `preparing` (its stored dataset's rows are made by the
    run_prep job)."""
    combos = expand.combinations(body.grid, body.overrides, max_runs)
    source = "grid" if body.grid is not None else "overrides"
    configs = expand.validated(body.name, body.base, combos, source)
    checked = []
    for index, (config, overrides) in enumerate(zip(configs, combos, strict=True)):
        with _naming(index, overrides):
            config = runs.with_checked_webhook(config, policy)
            runs.check_judge_urls(config, policy)
        checked.append(config)
    project_id = projects.resolve_for(session, caller, body.project)
    created_by = caller.token.id
    sweep = repository.insert_sweep(
        session,
        name=body.name,
        base_config=body.base,
        grid=body.grid,
        n_runs=len(combos),
        project_id=project_id,
        created_by_token_id=created_by,
    )
    tokens: list[SweepRunToken] = []
    preparing = False
    for index, (config, overrides) in enumerate(zip(checked, combos, strict=True)):
        tag = runs.SweepTag(sweep.id, index, overrides)
        with _naming(index, overrides):
            run, token = runs.create_run(
                session, config, sweep=tag, project_id=project_id, created_by=created_by
            )
        preparing = preparing or run.status == "preparing"
        tokens.append(
            SweepRunToken(run_id=run.id, name=run.name, overrides=overrides, learner_token=token)
        )
    return SweepCreated(sweep=detail(session, sweep), learners=tokens), preparing


class _naming:
    """Re-raise a run creation's 422 (a refused webhook or judge URL, a stored dataset that
    does not exist...) naming the combination; the transaction rolls back whole."""

    def __init__(self, index: int, overrides: dict[str, Any]) -> None:
        self.index, self.overrides = index, overrides

    def __enter__(self) -> None:
        return None

    def __exit__(self, _type: Any, exc: BaseException | None, _tb: Any) -> None:
        if isinstance(exc, Unprocessable):
            field = str(exc.extra.get("field", ""))
            raise expand.combination_refused(
                self.index, self.overrides, field, exc.message, [], exc.code
            ) from None


def get_sweep(session: Session, sweep_id: uuid.UUID) -> Sweep:
    sweep = repository.get(session, sweep_id)
    if sweep is None:
        raise NotFound(f"sweep {sweep_id} not found", code=ErrorCode.sweep_not_found)
    return sweep


def list_sweeps(
    session: Session, limit: int, offset: int, project_id: uuid.UUID | None = None
) -> list[SweepOut]:
    sweeps = repository.list_sweeps(session, limit, offset, project_id)
    counts = repository.statuses(session, [s.id for s in sweeps])
    return [_out(s, counts[s.id]) for s in sweeps]


def _out(sweep: Sweep, statuses: dict[str, int]) -> SweepOut:
    return SweepOut(
        id=sweep.id,
        name=sweep.name,
        n_runs=sweep.n_runs,
        grid=sweep.grid,
        created_at=sweep.created_at,
        statuses=statuses,
        project_id=sweep.project_id,
        project=sweep.project.name,
        created_by_token_id=sweep.created_by_token_id,
    )


def detail(session: Session, sweep: Sweep) -> SweepDetail:
    """The sweep with each run's overrides, status, versions, latest reward, latest eval
    accuracy, stale waste (whole run) and spend."""
    members = repository.runs_of(session, sweep.id)
    ids = [r.id for r in members]
    rewards = figures.last_version_means(session, ids, "reward_mean")
    evals = figures.eval_accuracy_by_version(session, ids)
    statuses: dict[str, int] = {}
    rows: list[SweepRun] = []
    for run in members:
        statuses[run.status] = statuses.get(run.status, 0) + 1
        version, accuracy = figures.latest_eval(evals[run.id]) or (None, None)
        rows.append(
            SweepRun(
                id=run.id,
                index=run.sweep_index if run.sweep_index is not None else len(rows),
                name=run.name,
                overrides=run.overrides or {},
                status=run.status,  # type: ignore[arg-type]
                status_reason=run.status_reason,
                current_version=run.current_version,
                best_version=run.best_version,
                best_value=run.best_value,
                last_reward=rewards.get(run.id),
                eval_version=version,
                eval_accuracy=accuracy,
                stale_waste=stale_waste(session, run.id).ratio,
                spent_usd=run.spent_usd,
            )
        )
    return SweepDetail(**_out(sweep, statuses).model_dump(), runs=rows)


def act(
    session: Session, sweep_id: uuid.UUID, action: str, reason: str | None
) -> SweepActionResult:
    """`action` on every run of the sweep, each by lifecycle.admin_action (its compare-and-set
    and its event). A run whose status does not allow the action (409 invalid_transition) is
    reported with the refusal and left unchanged; the others move, in the one transaction."""
    get_sweep(session, sweep_id)
    outcomes: list[RunActionOutcome] = []
    for run_id in repository.run_ids_of(session, sweep_id):
        try:
            run: Run = lifecycle.admin_action(session, run_id, action, reason)
        except Conflict as exc:
            outcomes.append(
                RunActionOutcome(
                    run_id=run_id,
                    name=_name(session, run_id),
                    status=exc.extra["status"],
                    moved=False,
                    code=exc.code.value,
                    detail=exc.message,
                )
            )
            continue
        outcomes.append(
            RunActionOutcome(
                run_id=run.id, name=run.name, status=run.status, moved=True, code=None, detail=None
            )  # type: ignore[arg-type]
        )
    moved = sum(o.moved for o in outcomes)
    return SweepActionResult(
        action=action, moved=moved, refused=len(outcomes) - moved, runs=outcomes
    )


def _name(session: Session, run_id: uuid.UUID) -> str:
    return runs.get_run(session, run_id).name
