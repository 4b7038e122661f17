"""The learner's eval calls (docs/architecture/protocol.md, "Learner calls"): it claims the
uploaded eval batches and posts their scores, fenced on its learner lease; the eval ledger's
rules are server/evals/service.py's."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request, Response
from sqlalchemy.orm import Session

from protocol.error_codes import ErrorCode
from protocol.schemas_learner import (
    EvalClaimRequest,
    EvalClaimResponse,
    EvalResultsRequest,
    EvalResultsResponse,
    EvalVersionResult,
)
from protocol.storage import ObjectStore
from server.config import Settings
from server.errors import NotFound
from server.evals import service
from server.evals.ledger import EVAL
from server.idempotency.keys import KeyHeader, keyed_call
from server.idempotency.store import in_session, sent
from server.learner import claims
from server.learner import repository as learner_repo
from server.learner import service as learner_service
from server.learner.router import waiting_claim
from server.learner.service import fence
from server.leases import ledger
from server.models import Token
from server.request_deps import LearnerCredentials, SessionDep, SettingsDep
from server.routing import TransactionalRoute
from server.tokens.auth import LearnerDep

router = APIRouter(prefix="/api/v1/runs/{run_id}", tags=["evals"], route_class=TransactionalRoute)


def _claim_once(
    session: Session,
    store: ObjectStore,
    settings: Settings,
    token: Token,
    run_id: uuid.UUID,
    body: EvalClaimRequest,
) -> EvalClaimResponse:
    """One attempt of the eval claim: the one claim pipeline under the eval kind's policy."""
    return learner_service.claim(session, store, settings, token, run_id, body, claims.EVALUATION)


@router.post("/evals/claim", response_model=EvalClaimResponse)
async def claim(
    run_id: uuid.UUID,
    body: EvalClaimRequest,
    request: Request,
    credentials: LearnerCredentials,
    idempotency_key: KeyHeader = None,
) -> EvalClaimResponse | Response:
    """The learner claims uploaded eval batches (fenced; never training batches), with their
    items' prompts and reference columns. Long-poll: each attempt is its own transaction; under
    an Idempotency-Key the attempt that claims stores its answer with the claim."""
    return await waiting_claim(
        request,
        credentials,
        idempotency_key,
        body,
        claims.EVALUATION,
        lambda session, store, settings, token: _claim_once(
            session, store, settings, token, run_id, body
        ),
    )


@router.post("/evals", response_model=EvalResultsResponse)
def post_results(
    run_id: uuid.UUID,
    body: EvalResultsRequest,
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    token: LearnerDep,
    idempotency_key: KeyHeader = None,
) -> EvalResultsResponse | Response:
    """The learner's scores of one claimed eval batch (fenced): the reward and the accuracy
    reward's value of every sample; the version's aggregates when its last item is scored."""
    keyed = keyed_call(idempotency_key, lambda: token.digest, request, body)
    return sent(in_session(session, keyed, lambda: _score(session, settings, token, run_id, body)))


def _score(
    session: Session, settings: Settings, token: Token, run_id: uuid.UUID, body: EvalResultsRequest
) -> EvalResultsResponse:
    fence(session, settings, token, run_id, body.fencing)
    batch = learner_repo.get_batch(session, run_id, body.batch_id)
    if batch is None or not ledger.is_of(batch.kind, EVAL):
        raise NotFound("eval batch not found", code=ErrorCode.batch_not_found)
    service.refuse_unclaimed(batch, body.fencing)
    samples = [(s.item_id, s.reward, s.accuracy_value) for s in body.samples]
    done = service.score(session, run_id, batch, samples)
    run = learner_repo.get_run(session, run_id)
    assert run is not None
    row = service.finished_result(session, run_id, batch.adapter_version) if done else None
    result = None if row is None else EvalVersionResult.model_validate(row, from_attributes=True)
    return EvalResultsResponse(
        version=batch.adapter_version, version_done=done, run_status=run.status, result=result
    )
