"""Pool learners (docs/guides/pool-learners.md): registration with a registration token, the
take (one compare-and-set per run, never more than `max_runs` held, and with a memory payload
only the runs that fit it: protocol/learner_memory.py `pool_fit`), the admin's list and
revoke. What a pool learner's token may call on a run it holds is the learner feature's one
check (server/learner/service.py `authorize`)."""

from __future__ import annotations

import uuid

from sqlalchemy.orm import Session

from protocol.error_codes import ErrorCode
from protocol.learner_memory import GB, RunNeed, pool_fit, run_need
from server.config import Settings
from server.errors import NotFound, Unauthorized, Unprocessable
from server.learner import repository as learner_repo
from server.learners import repository as repo
from server.learners.schemas import (
    LearnerMemory,
    LearnerRegister,
    LearnerRegistered,
    LeftRun,
    PoolLearnerOut,
    TakenRun,
    TakeRequest,
    TakeResponse,
)
from server.models import PoolLearner, Run, Token
from server.runs import service as runs_service
from server.tokens import service as tokens

# How many candidates a take reads per run it may still take: the rest lost races.
_CANDIDATES_PER_SLOT = 4
# With a memory check, at least this many: runs too big for it, oldest first, must not hide a
# smaller one behind them.
_CANDIDATES_WITH_MEMORY = 64


def register(session: Session, registration: Token, body: LearnerRegister) -> LearnerRegistered:
    """One use of the registration token counted; the pool learner's row, in the token's
    project (none: the shared fleet), and its `pool_learner` token (scope_id = its id), whose
    plaintext is shown only here."""
    tokens.consume_registration(session, registration)
    learner = repo.insert(
        session,
        name=body.name,
        model=body.model,
        tokenizer_fingerprint=body.tokenizer_fingerprint,
        max_runs=body.max_runs,
        memory_budget_gb=body.memory_budget_gb,
        gpu_type=body.gpu_type,
        price_per_hour=body.price_per_hour,
        project_id=registration.project_id,
    )
    minted = tokens.mint(session, "pool_learner", name=body.name, scope_id=learner.id)
    learner.token_id = minted.token.id
    session.flush()
    return LearnerRegistered(
        learner_id=learner.id, learner_token=minted.plaintext, project_id=learner.project_id
    )


def take(session: Session, settings: Settings, token: Token, body: TakeRequest) -> TakeResponse:
    """Assign up to `body.max` runs that need a learner and that it fits, each by its own
    compare-and-set, never more than its `max_runs` held at once (the runs it already holds
    counted). Answers at once: an empty list when none is takeable."""
    assert token.scope_id is not None
    learner = repo.lock_live(session, token.scope_id)
    if learner is None:
        raise Unauthorized("pool learner revoked", code=ErrorCode.token_revoked)
    if body.max > learner.max_runs:
        raise Unprocessable(
            f"max {body.max} is over this pool learner's max_runs ({learner.max_runs})",
            errors=[
                {
                    "field": "max",
                    "message": f"at most max_runs ({learner.max_runs})",
                    "type": "value",
                }
            ],
            code=ErrorCode.invalid_value,
        )
    held = repo.held_runs(session, learner.id)
    room = min(body.max, learner.max_runs - len(held))
    hold_s = settings.learner_lease_ttl_s
    fit = _MemoryFit(session, learner.model, body.memory, held)
    got: list[uuid.UUID] = []
    if room > 0:
        limit = room * _CANDIDATES_PER_SLOT
        if body.memory is not None:
            limit = max(limit, _CANDIDATES_WITH_MEMORY)
        for run_id in repo.candidates(session, learner, limit):
            if run_id in held or not fit.fits(run_id):
                continue
            if repo.take_one(session, learner, run_id, hold_s):
                got.append(run_id)
                fit.taken()
                if len(got) == room:
                    break
    learner_repo.touch_pool_learner(session, learner.id)
    return TakeResponse(
        runs=[_taken(run) for run in repo.taken(session, got)],
        held=[*held, *got],
        hold_s=hold_s,
        left=fit.left,
    )


class _MemoryFit:
    """A take's memory check: each candidate against the runs held and taken so far (none
    without a memory payload); the runs that do not fit, with the reason, in `left`."""

    def __init__(
        self,
        session: Session,
        model: str,
        memory: LearnerMemory | None,
        held: list[uuid.UUID],
    ) -> None:
        self.session = session
        self.memory = memory
        self.shape = memory.shape(model) if memory is not None else None
        self.needs: list[RunNeed] = [self._need(r) for r in held] if memory else []
        self.left: list[LeftRun] = []
        self._pending: RunNeed | None = None

    def _need(self, run_id: uuid.UUID) -> RunNeed:
        return run_need(runs_service.config_of(self.session, run_id))

    def fits(self, run_id: uuid.UUID) -> bool:
        if self.memory is None or self.shape is None:
            return True
        self._pending = self._need(run_id)
        budget = self.memory.budget_gb * GB
        verdict = pool_fit(self.shape, budget, self.needs, self._pending, self.memory.weight_bytes)
        if not verdict.fits:
            self.left.append(LeftRun(run_id=run_id, reason=verdict.reason))
        return verdict.fits

    def taken(self) -> None:
        """The run `fits` last said yes to was taken: it counts from now on."""
        if self._pending is not None:
            self.needs.append(self._pending)


def _taken(run: Run) -> TakenRun:
    return TakenRun(
        run_id=run.id,
        name=run.name,
        status=run.status,
        base_model=run.base_model,
        tokenizer_fingerprint=run.tokenizer_fingerprint,
        current_version=run.current_version,
        attach_path=f"/api/v1/runs/{run.id}/learner/attach",
    )


def to_out(learner: PoolLearner, held: list[uuid.UUID]) -> PoolLearnerOut:
    return PoolLearnerOut(
        id=learner.id,
        name=learner.name,
        model=learner.model,
        tokenizer_fingerprint=learner.tokenizer_fingerprint,
        max_runs=learner.max_runs,
        memory_budget_gb=learner.memory_budget_gb,
        gpu_type=learner.gpu_type,
        price_per_hour=learner.price_per_hour,
        project_id=learner.project_id,
        project=learner.project,
        runs_held=held,
        created_at=learner.created_at,
        last_seen_at=learner.last_seen_at,
        revoked_at=learner.revoked_at,
        revoked=learner.revoked_at is not None,
    )


def list_learners(session: Session) -> list[PoolLearnerOut]:
    """Every pool learner with the runs it holds now (the API's list and the Learners page)."""
    held = repo.held_by_each(session)
    return [to_out(learner, held.get(learner.id, [])) for learner in repo.list_all(session)]


def revoke(session: Session, learner_id: uuid.UUID) -> PoolLearnerOut:
    """Revoke the pool learner (idempotent): its token (its next call answers 401), and its
    held runs become takeable at once (their learner leases end)."""
    learner = repo.get(session, learner_id)
    if learner is None:
        raise NotFound(f"no pool learner {learner_id}", code=ErrorCode.pool_learner_not_found)
    repo.revoke(session, learner_id)
    tokens.revoke_scope(session, "pool_learner", learner_id)
    repo.release_runs(session, learner_id)
    session.refresh(learner)
    return to_out(learner, [])
