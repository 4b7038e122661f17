"""HTTP layer of the pool learners (docs/architecture/protocol.md, "Pool learners")."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, status

from server.audit.recorder import AuditDep
from server.learners import service
from server.learners.schemas import (
    LearnerRegister,
    LearnerRegistered,
    PoolLearnerOut,
    TakeRequest,
    TakeResponse,
)
from server.request_deps import SessionDep, SettingsDep
from server.routing import TransactionalRoute
from server.tokens.auth import AdminDep, PoolLearnerDep, RegistrationDep

router = APIRouter(prefix="/api/v1/learners", tags=["learners"], route_class=TransactionalRoute)


@router.post("/register", status_code=status.HTTP_201_CREATED, response_model=LearnerRegistered)
def register(
    body: LearnerRegister, session: SessionDep, registration: RegistrationDep, audit: AuditDep
) -> LearnerRegistered:
    """Register a pool learner with a registration token (one use counted); answers its id and
    its pool_learner token, once."""
    registered = service.register(session, registration, body)
    audit.record(session, registration, "learner", registered.learner_id)
    return registered


@router.post("/take", response_model=TakeResponse)
def take(
    body: TakeRequest, session: SessionDep, settings: SettingsDep, token: PoolLearnerDep
) -> TakeResponse:
    """Take up to `max` runs that need a learner (pending, or leasing/paused with no live
    learner lease) of this pool learner's model and tokenizer, never more than its max_runs
    held at once. Answers at once; then attach to each (`attach_path`) within `hold_s`."""
    return service.take(session, settings, token, body)


@router.get("", response_model=list[PoolLearnerOut])
def list_learners(session: SessionDep, _admin: AdminDep) -> list[PoolLearnerOut]:
    """Every pool learner with the runs it holds now."""
    return service.list_learners(session)


@router.post("/{learner_id}/revoke", response_model=PoolLearnerOut)
def revoke(
    learner_id: uuid.UUID, session: SessionDep, admin: AdminDep, audit: AuditDep
) -> PoolLearnerOut:
    """Revoke the pool learner and its token: its calls answer 401, its runs are takeable."""
    learner = service.revoke(session, learner_id)
    audit.record(session, admin, "learner", learner_id)
    return learner
