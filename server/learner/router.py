"""HTTP layer of the learner's calls and the admin reads of a run's metrics and ledger."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from protocol.schemas import INT_MAX
from protocol.schemas_learner import (
    AttachRequest,
    AttachResponse,
    ClaimRequest,
    ClaimResponse,
    EvalClaimResponse,
    FailRequest,
    FailResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    MetricsAccepted,
    MetricsRequest,
    PublishRequest,
    PublishResponse,
    RejectRequest,
    RejectResponse,
    SpotCheckRequest,
    SpotCheckResponse,
    UploadsRequest,
    UploadsResponse,
)
from protocol.storage import ObjectStore
from server import wakeups
from server.config import Settings
from server.db import transaction
from server.deps import (
    LearnerCredentials,
    LearnerDep,
    SessionDep,
    SettingsDep,
    StoreDep,
    require_learner,
)
from server.idempotency.keys import KeyedCall, KeyHeader, keyed_call
from server.idempotency.store import Answer, in_session, sent
from server.learner import claims, service, telemetry, trajectories
from server.learner import publish as publish_service
from server.learner.ledger import ledger_model
from server.learner.schemas import Ledger, RunMetrics, TrajectorySampleOut
from server.long_poll import long_poll
from server.models import Token
from server.request_deps import Credentials
from server.routing import TransactionalRoute
from server.tokens.access import RunReader
from server.versions import service as versions

# The answers of the claim kinds (server/learner/claims.py).
Claimed = TypeVar("Claimed", ClaimResponse, EvalClaimResponse)

router = APIRouter(prefix="/api/v1/runs/{run_id}", tags=["learner"], route_class=TransactionalRoute)


@router.post("/learner/attach", response_model=AttachResponse)
def attach(
    run_id: uuid.UUID,
    body: AttachRequest,
    session: SessionDep,
    settings: SettingsDep,
    store: StoreDep,
    token: LearnerDep,
    request: Request,
    idempotency_key: KeyHeader = None,
) -> AttachResponse | Response:
    """Take the run's learner lease (a new fencing token): answers the current version with
    its adapter and latest checkpoint files, the run config and the heartbeat interval; 409
    while another learner holds the run or it is preparing, once it has ended, or when the
    model, tokenizer or rewards differ from the run's."""
    keyed = _keyed(idempotency_key, token, request, body)
    return sent(
        in_session(
            session, keyed, lambda: service.attach(session, store, settings, token, run_id, body)
        )
    )


@router.post("/learner/heartbeat", response_model=HeartbeatResponse)
def heartbeat(
    run_id: uuid.UUID,
    body: HeartbeatRequest,
    session: SessionDep,
    settings: SettingsDep,
    token: LearnerDep,
) -> HeartbeatResponse:
    """Extend the learner lease (fenced); answers the current version and the run's status."""
    return service.heartbeat(session, settings, token, run_id, body)


@router.post("/learner/fail", response_model=FailResponse)
def fail(
    run_id: uuid.UUID,
    body: FailRequest,
    session: SessionDep,
    settings: SettingsDep,
    token: LearnerDep,
    request: Request,
    idempotency_key: KeyHeader = None,
) -> FailResponse | Response:
    """Report an error a restart cannot fix: the run becomes `failed` (fenced)."""
    keyed = _keyed(idempotency_key, token, request, body)
    return sent(
        in_session(session, keyed, lambda: service.fail(session, settings, token, run_id, body))
    )


@router.post("/batches/claim", response_model=ClaimResponse)
async def claim(
    run_id: uuid.UUID,
    body: ClaimRequest,
    request: Request,
    credentials: LearnerCredentials,
    idempotency_key: KeyHeader = None,
) -> ClaimResponse | Response:
    """Long-poll: each attempt is its own short transaction; nothing is held while waiting.
    Under an Idempotency-Key, the attempt that claims stores its answer with the claim; an
    empty answer is not kept."""
    return await waiting_claim(
        request,
        credentials,
        idempotency_key,
        body,
        claims.TRAINING,
        lambda session, store, settings, token: service.claim(
            session, store, settings, token, run_id, body, claims.TRAINING
        ),
    )


async def waiting_claim(
    request: Request,
    credentials: Credentials,
    idempotency_key: str | None,
    body: Any,
    policy: claims.ClaimPolicy[Any, Claimed],
    once: Callable[[Session, ObjectStore, Settings, Token], Claimed],
) -> Claimed | Response:
    """Every kind's claim route (the training and the eval claim): `once` (one attempt of the
    claim pipeline, server/learner/service.py `claim`) long-polled, each attempt its own
    transaction, woken on the learner channel; it ends at an answer with batches or one the
    kind calls settled. Under an Idempotency-Key the attempt that claims stores its answer
    with the claim; an empty answer is not kept."""
    settings: Settings = request.app.state.settings

    def attempt() -> Claimed | Answer:
        with transaction(request.app.state.sessionmaker) as session:
            token = require_learner(session, credentials)
            keyed = _keyed(idempotency_key, token, request, body)
            store = request.app.state.store
            return in_session(
                session,
                keyed,
                lambda: once(session, store, settings, token),
                kept=lambda claimed: bool(claimed.batches),
            )

    return sent(
        await long_poll(
            lambda _deadline: run_in_threadpool(attempt),
            lambda result: (
                isinstance(result, Answer) or bool(result.batches) or policy.settled(result)
            ),
            body.wait_s,
            settings,
            wakeups.LEARNER,
        )
    )


@router.post("/batches/{batch_id}/reject", response_model=RejectResponse)
def reject(
    run_id: uuid.UUID,
    batch_id: uuid.UUID,
    body: RejectRequest,
    session: SessionDep,
    settings: SettingsDep,
    token: LearnerDep,
    request: Request,
    idempotency_key: KeyHeader = None,
) -> RejectResponse | Response:
    """Reject a batch claimed under this token (checksum, invalid, prompt_mismatch, spot_check,
    reward_error): its rows are re-queued with an attempt counted; 409 when not so claimed."""
    keyed = _keyed(idempotency_key, token, request, body)
    return sent(
        in_session(
            session, keyed, lambda: service.reject(session, settings, token, run_id, batch_id, body)
        )
    )


@router.post("/uploads", response_model=UploadsResponse)
def uploads(
    run_id: uuid.UUID,
    body: UploadsRequest,
    session: SessionDep,
    settings: SettingsDep,
    store: StoreDep,
    token: LearnerDep,
    request: Request,
    idempotency_key: KeyHeader = None,
) -> UploadsResponse | Response:
    """Presigned PUTs for the files of version current + 1 (409 for any other version); an
    object left at one of its keys by an unpublished attempt is removed first."""
    keyed = _keyed(idempotency_key, token, request, body)
    return sent(
        in_session(
            session,
            keyed,
            lambda: publish_service.uploads(session, store, settings, token, run_id, body),
        )
    )


@router.post("/adapters", response_model=PublishResponse)
def publish(
    run_id: uuid.UUID,
    body: PublishRequest,
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    store: StoreDep,
    token: LearnerDep,
    idempotency_key: KeyHeader = None,
) -> PublishResponse | Response:
    """Publish version current + 1: its uploaded files, the batches it consumed (claimed under
    this token) and its metrics; the run completes when `final` or at `max_versions`."""
    keyed = _keyed(idempotency_key, token, request, body)
    published = in_session(
        session,
        keyed,
        lambda: publish_service.publish(session, store, settings, token, run_id, body),
    )
    versions.poke_after_commit(request.app, session)  # workers long-polling hear of it at once
    return sent(published)


@router.post("/metrics", response_model=MetricsAccepted)
def post_metrics(
    run_id: uuid.UUID,
    body: MetricsRequest,
    session: SessionDep,
    settings: SettingsDep,
    token: LearnerDep,
    request: Request,
    idempotency_key: KeyHeader = None,
) -> MetricsAccepted | Response:
    """Record the learner's metric points (fenced on the token, accepted after completion)."""
    keyed = _keyed(idempotency_key, token, request, body)
    return sent(
        in_session(
            session, keyed, lambda: telemetry.record_metrics(session, settings, token, run_id, body)
        )
    )


@router.post("/spot-checks", response_model=SpotCheckResponse)
def spot_check(
    run_id: uuid.UUID,
    body: SpotCheckRequest,
    session: SessionDep,
    settings: SettingsDep,
    token: LearnerDep,
    request: Request,
    idempotency_key: KeyHeader = None,
) -> SpotCheckResponse | Response:
    """Record a spot check of a worker's batch; the worker is quarantined when this check or
    its running mean is above the run's `alarms.spot_check_mismatch`."""
    keyed = _keyed(idempotency_key, token, request, body)
    return sent(
        in_session(
            session, keyed, lambda: telemetry.spot_check(session, settings, token, run_id, body)
        )
    )


@router.get("/metrics", response_model=RunMetrics)
def get_metrics(
    run_id: uuid.UUID,
    session: SessionDep,
    _caller: RunReader,
    since_step: int | None = Query(
        None, ge=0, le=INT_MAX, description="Only points with step ≥ this."
    ),
) -> RunMetrics:
    """The run's learner metric series (from `since_step`) and the figures computed on read."""
    return telemetry.run_metrics(session, run_id, since_step)


@router.get("/trajectories/sample", response_model=TrajectorySampleOut)
def get_trajectory_sample(
    run_id: uuid.UUID,
    session: SessionDep,
    store: StoreDep,
    _caller: RunReader,
    batch_id: uuid.UUID | None = Query(
        None, description="A format 2 batch of the run (default: its latest consumed one)."
    ),
    row: int = Query(
        0, ge=0, le=INT_MAX, description="The trajectory (rows sorted by prompt row, group)."
    ),
) -> TrajectorySampleOut:
    """One trajectory of a multi-turn run: transcript, tool calls, stop reason, token spans."""
    return trajectories.sample(session, store, run_id, batch_id, row)


@router.get("/ledger", response_model=Ledger)
def get_ledger(run_id: uuid.UUID, session: SessionDep, _caller: RunReader) -> Ledger:
    """The run's prompt rows by state, drop reason and epoch, and whether they balance."""
    return ledger_model(session, run_id)


def _keyed(header: str | None, token: Token, request: Request, body: BaseModel) -> KeyedCall | None:
    """The call's Idempotency-Key, scoped to its learner token."""
    return keyed_call(header, lambda: token.digest, request, body)
