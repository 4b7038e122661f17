"""The learner side of the rollout proxy: one fenced learner per run, batch claims with the
staleness window re-checked, rejections, and the rules of the learner lease
(docs/architecture/contract.md, invariants 2, 5, 7, 12). Adapter uploads and publishing live in
publish.py."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy.orm import Session

from protocol import rewards
from protocol.error_codes import ErrorCode
from protocol.run_config import RunConfig
from protocol.schemas_learner import (
    MISSING_REWARDS,
    PREPARING,
    AttachRequest,
    AttachResponse,
    FailRequest,
    FailResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    RejectRequest,
    RejectResponse,
    StoredFile,
)
from protocol.storage import ObjectStore
from server.config import Settings
from server.errors import Conflict, FencingLost, Forbidden, NotFound
from server.evals import service as evals
from server.events.service import raise_event
from server.learner import claims
from server.learner import repository as repo
from server.leases import ledger
from server.leases.kinds import WorkKind
from server.leases.ledger import kind_of
from server.models import RolloutBatch, Token
from server.runs import lifecycle
from server.runs import service as runs_service
from server.workers import repository as workers

CLAIM_PAGE = 32
Answer = TypeVar("Answer")


def run_config(session: Session, run_id: uuid.UUID) -> RunConfig:
    """The run's validated config (parsed once per run by the runs feature's cache)."""
    run = repo.run_with_deferred_config(session, run_id)
    if run is None:
        raise NotFound("run not found", code=ErrorCode.run_not_found)
    return runs_service.get_config(run)


def authorize(session: Session, token: Token, run_id: uuid.UUID) -> None:
    """The one check of a learner credential's reach (invariant 10): a run's learner token acts
    only on its own run (others look absent); a pool learner's token only on the runs whose
    `pool_learner_id` is it (others: 403 `run_not_held`; docs/guides/pool-learners.md)."""
    if token.kind == "pool_learner":
        exists, holder = repo.pool_holder(session, run_id)
        if not exists:
            raise NotFound("run not found", code=ErrorCode.run_not_found)
        if holder is None or holder != token.scope_id:
            raise Forbidden(
                "this pool learner does not hold the run: take it first",
                code=ErrorCode.run_not_held,
            )
        return
    if token.scope_id != run_id:
        raise NotFound("run not found", code=ErrorCode.run_not_found)


def pool_learner_of(token: Token) -> uuid.UUID | None:
    """The pool learner behind a token (None for a run's own learner token)."""
    return token.scope_id if token.kind == "pool_learner" else None


def fence(
    session: Session,
    settings: Settings,
    token: Token,
    run_id: uuid.UUID,
    fencing: int,
    *,
    live_run: bool = True,
) -> repo.FencedRun:
    """Authorize, then the fenced compare-and-set (extends the learner lease); 409 if lost."""
    authorize(session, token, run_id)
    run = repo.fence(session, run_id, fencing, settings.learner_lease_ttl_s, live_run=live_run)
    if run is None:
        raise FencingLost(
            "learner lease lost (stale fencing token, expired lease or finished run): re-attach",
            code=ErrorCode.fencing_lost,
        )
    return run


def attach(
    session: Session,
    store: ObjectStore,
    settings: Settings,
    token: Token,
    run_id: uuid.UUID,
    body: AttachRequest,
) -> AttachResponse:
    authorize(session, token, run_id)
    _refuse_another_model(session, run_id, body.model)
    if body.reward_names is not None:
        _refuse_missing_rewards(session, run_id, body.reward_names)
    ttl = settings.learner_lease_ttl_s
    run = repo.attach(
        session, run_id, body.tokenizer_fingerprint, ttl, pool_learner_id=pool_learner_of(token)
    )
    if run is None:
        raise _attach_refusal(session, run_id, body.tokenizer_fingerprint)
    lifecycle.move(session, run_id, "attach", "learner attached")
    repo.release_claims(session, run_id)
    config = run_config(session, run_id)
    if config.eval is not None:
        evals.queue_version(session, run_id, 0)  # the base model's eval (once)
    raise_event(
        session,
        kind="learner.attached",
        severity="info",
        message=f"learner attached at version {run.current_version}",
        run_id=run_id,
        data={"fencing": run.learner_fencing, "version": run.current_version},
    )
    resume = _resume(session, store, settings, run_id, run.current_version)
    return AttachResponse(
        fencing=run.learner_fencing,
        current_version=run.current_version,
        resume_checkpoint=resume.checkpoint,
        resume_checkpoint_version=resume.checkpoint_version,
        resume_adapter=resume.adapter,
        resume_learner_step=resume.learner_step,
        run_config=runs_service.shown_config(config.for_learner()),
        run_status=_status(session, run_id),
        heartbeat_interval_s=ttl / 3.0,
        lease_ttl_s=ttl,
    )


def _status(session: Session, run_id: uuid.UUID) -> str | None:
    run = repo.get_run(session, run_id)
    return None if run is None else run.status


def _refuse_missing_rewards(session: Session, run_id: uuid.UUID, loadable: list[str]) -> None:
    """A learner whose host cannot load one of the run's rewards could never train it: the
    run fails at once with the reason (unless another learner holds a live lease: that one
    can), and attach answers 409 naming the rewards. The failure is committed here, before
    the 409 rolls the request's transaction back."""
    missing = rewards.not_loadable([r.name for r in run_config(session, run_id).rewards], loadable)
    if not missing:
        return
    reason = (
        f"{MISSING_REWARDS}s {', '.join(missing)}: its operator allows user rewards with "
        "--reward-module or entry points of the group asyncgrpo.rewards"
    )
    failed = lifecycle.move(session, run_id, "fail", reason[:2000], repo.lease_free())
    if not failed and _has_ended(session, run_id):
        return  # attach refuses it as an ended run
    if failed:
        raise_event(
            session,
            kind="run.failed",
            severity="critical",
            message=f"run failed: {reason}",
            run_id=run_id,
            data={"reason": reason, "missing_rewards": missing},
        )
        session.commit()
    raise Conflict(
        reason, missing_rewards=missing, run_failed=failed, code=ErrorCode.rewards_missing
    )


def _has_ended(session: Session, run_id: uuid.UUID) -> bool:
    run = repo.get_run(session, run_id)
    return run is None or run.status in lifecycle.TERMINAL


def _refuse_another_model(session: Session, run_id: uuid.UUID, model: str | None) -> None:
    if model is None:
        return
    run = repo.get_run(session, run_id)
    if run is not None and run.base_model != model:
        raise Conflict(
            f"the run trains {run.base_model!r} but this learner loaded {model!r} (--model)",
            base_model=run.base_model,
            model=model,
            code=ErrorCode.model_mismatch,
        )


def _attach_refusal(session: Session, run_id: uuid.UUID, fingerprint: str) -> Exception:
    current = repo.get_run(session, run_id)
    if current is None:
        return NotFound("run not found", code=ErrorCode.run_not_found)
    if current.status in lifecycle.TERMINAL:
        return Conflict(f"run is {current.status}", status=current.status, code=ErrorCode.run_ended)
    if current.status == "preparing":
        return Conflict(
            PREPARING + ": attach again once it is pending",
            status=current.status,
            code=ErrorCode.run_preparing,
        )
    if current.tokenizer_fingerprint not in (None, fingerprint):
        return Conflict(
            "tokenizer fingerprint differs from the run's",
            run_fingerprint=current.tokenizer_fingerprint,
            code=ErrorCode.fingerprint_mismatch,
        )
    return Conflict(
        "another learner holds this run: wait as a standby and retry after its lease expires",
        code=ErrorCode.held_by_another_learner,
    )


@dataclass(frozen=True)
class _Resume:
    adapter: list[StoredFile] | None = None
    learner_step: int | None = None
    checkpoint: list[StoredFile] | None = None
    checkpoint_version: int | None = None


def _resume(
    session: Session, store: ObjectStore, settings: Settings, run_id: uuid.UUID, version: int
) -> _Resume:
    """The current version's adapter and learner step, and the latest checkpoint at or below
    it (versions between checkpoints carry none): the learner restores those weights with that
    optimizer state (docs/architecture/contract.md, invariant 7)."""
    if version == 0:
        return _Resume()
    current = repo.adapter_version(session, run_id, version)
    if current is None:
        return _Resume()
    ttl = settings.security.url_ttl_s
    adapter = stored_files(store, current.files, ttl)
    latest = repo.latest_checkpoint(session, run_id, version)
    if latest is None:
        return _Resume(adapter, current.learner_step)
    checkpoint = stored_files(store, latest.checkpoint_files, ttl)
    return _Resume(adapter, current.learner_step, checkpoint, latest.version)


def stored_files(store: ObjectStore, files: dict[str, Any], ttl_s: int) -> list[StoredFile]:
    return [
        StoredFile(
            name=name,
            key=meta["key"],
            sha256=meta["sha256"],
            size=meta["bytes"],
            url=store.presign_get(meta["key"], ttl_s),
        )
        for name, meta in sorted(files.items())
    ]


def heartbeat(
    session: Session, settings: Settings, token: Token, run_id: uuid.UUID, body: HeartbeatRequest
) -> HeartbeatResponse:
    run = fence(session, settings, token, run_id, body.fencing)
    pool_learner = pool_learner_of(token)
    if pool_learner is not None:
        repo.touch_pool_learner(session, pool_learner)
    return HeartbeatResponse(current_version=run.current_version, status=run.status)


def fail(
    session: Session, settings: Settings, token: Token, run_id: uuid.UUID, body: FailRequest
) -> FailResponse:
    """The learner reports an error a restart cannot fix: the run becomes `failed` with the
    reason (the fenced compare-and-set has locked the live run row) and a `run.failed` event."""
    fence(session, settings, token, run_id, body.fencing)
    if not lifecycle.move(session, run_id, "fail", body.reason):
        raise Conflict("the run has already ended", code=ErrorCode.run_ended)
    raise_event(
        session,
        kind="run.failed",
        severity="critical",
        message=f"run failed: {body.reason}",
        run_id=run_id,
        data={"reason": body.reason},
    )
    return FailResponse(run_status="failed")


def claim(
    session: Session,
    store: ObjectStore,
    settings: Settings,
    token: Token,
    run_id: uuid.UUID,
    body: Any,
    policy: claims.ClaimPolicy[Any, Answer],
) -> Answer:
    """One claim attempt of the policy's kind, the one claim pipeline (the router long-polls
    by repeating it in fresh transactions): fenced, then what the kind's plan allows of its
    accepted batches claimed under the learner's token, answered as the kind answers."""
    run = fence(session, settings, token, run_id, body.fencing)
    config = run_config(session, run_id)
    plan = policy.plan(run, config, body)
    taken, stale = ([], 0) if plan is None else _take(session, run, config, policy, plan)
    ttl = settings.security.url_ttl_s
    return policy.answer(session, store, ttl, run, config, taken, plan, stale)


def _take(
    session: Session,
    run: repo.FencedRun,
    config: RunConfig,
    policy: claims.ClaimPolicy[Any, Any],
    plan: claims.Plan,
) -> tuple[claims.Taken, int]:
    """The kind's accepted batches, oldest adapter version first; those the kind finds outside
    its window rejected stale and their rows re-queued; stop at the first batch that would
    pass the plan's budget (one batch is always allowed)."""
    taken: claims.Taken = []
    spent = stale = 0
    while True:
        page = ledger.claim_page(session, run.id, CLAIM_PAGE, trained=policy.kind.trained)
        if not page:
            return taken, stale
        for batch in page:
            lag = policy.lag(plan, batch)
            if policy.outside(config, plan, batch):
                _reject_stale(session, run.id, policy.kind, batch, lag, plan.target)
                stale += 1
                continue
            if taken and spent + policy.cost(batch) > plan.budget:
                return taken, stale
            repo.claim_batch(session, batch.id, run.learner_fencing, lag, plan.target)
            taken.append((batch, lag))
            spent += policy.cost(batch)
            if spent >= plan.budget:
                return taken, stale


def _reject_stale(
    session: Session,
    run_id: uuid.UUID,
    kind: WorkKind,
    batch: RolloutBatch,
    lag: int | None,
    target: int | None,
) -> None:
    detail = f"staleness {lag} above max_staleness when trained into version {target}"
    repo.reject_batch(
        session,
        batch.id,
        "stale",
        detail,
        from_state="accepted",
        staleness=lag,
        target_version=target,
    )
    kind.requeue_batch(session, run_id, batch.id, "stale")


def reject(
    session: Session,
    settings: Settings,
    token: Token,
    run_id: uuid.UUID,
    batch_id: uuid.UUID,
    body: RejectRequest,
) -> RejectResponse:
    """A batch this learner claimed cannot be trained on: rejected, its rows re-queued at the
    front (an attempt counted), the worker's rejection count raised."""
    fence(session, settings, token, run_id, body.fencing)
    batch = repo.get_batch(session, run_id, batch_id)
    if batch is None:
        raise NotFound("batch not found", code=ErrorCode.batch_not_found)
    if batch.state != "claimed" or batch.claimed_fencing != body.fencing:
        raise Conflict(
            f"batch is {batch.state}, not claimed by this learner",
            state=batch.state,
            code=ErrorCode.batch_not_claimed,
        )
    repo.reject_batch(session, batch_id, body.reason, body.detail, from_state="claimed")
    requeued, dropped = kind_of(batch.kind).requeue_batch(session, run_id, batch_id, body.reason)
    workers.count_rejection(session, batch.worker_id)
    return RejectResponse(batch_id=batch_id, requeued=requeued, dropped=dropped)
