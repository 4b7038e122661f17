"""Who is calling, as request dependencies: the admin, learner and registration principals
(a bearer token of that kind, docs/architecture/security.md, "Tokens and security"), and the
holder of a token of any kind (the host checks of `asyncgrpo doctor`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from sqlalchemy.orm import Session

from protocol.error_codes import ErrorCode
from server.errors import Unauthorized
from server.models import Token
from server.request_deps import (
    AdminCredentials,
    Credentials,
    LearnerCredentials,
    PoolLearnerCredentials,
    RegistrationCredentials,
    SessionDep,
    WorkerCredentials,
    released,
)
from server.tokens import service as tokens


def bearer_token(credentials: Credentials) -> str:
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise Unauthorized("missing bearer token", code=ErrorCode.token_missing)
    return credentials.credentials


def _principal(session: Session, credentials: Credentials, *kinds: str) -> Token:
    return released(session, tokens.authenticate(session, bearer_token(credentials), kinds))


# A run's learner calls take either: a run's own token, or a pool learner's on the runs it holds.
LEARNER_KINDS = ("learner", "pool_learner")


def require_admin(session: SessionDep, credentials: AdminCredentials) -> Token:
    return _principal(session, credentials, "admin")


def require_learner(session: SessionDep, credentials: LearnerCredentials) -> Token:
    """A run's learner token, or a pool learner's token (its reach, the runs it holds, is
    checked per run: server/learner/service.py `authorize`)."""
    return _principal(session, credentials, *LEARNER_KINDS)


def require_pool_learner(session: SessionDep, credentials: PoolLearnerCredentials) -> Token:
    """A pool learner's token (server/learners/: its own calls). On the learner calls of a run
    it is read under the learner scheme (`require_learner`)."""
    return _principal(session, credentials, "pool_learner")


def require_registration(session: SessionDep, credentials: RegistrationCredentials) -> Token:
    return _principal(session, credentials, "registration")


ALL_KINDS = ("admin", "registration", "worker", "learner", "pool_learner")


def require_any_token(
    session: SessionDep,
    admin: AdminCredentials,
    registration: RegistrationCredentials,
    worker: WorkerCredentials,
    learner: LearnerCredentials,
    pool_learner: PoolLearnerCredentials,
) -> Token:
    """A live token of any kind. The five schemes read the one Authorization header: each is
    named so that the OpenAPI document says the operation takes any of them."""
    given = admin or registration or worker or learner or pool_learner
    return _principal(session, given, *ALL_KINDS)


AdminDep = Annotated[Token, Depends(require_admin)]
AnyTokenDep = Annotated[Token, Depends(require_any_token)]
LearnerDep = Annotated[Token, Depends(require_learner)]
PoolLearnerDep = Annotated[Token, Depends(require_pool_learner)]
RegistrationDep = Annotated[Token, Depends(require_registration)]
