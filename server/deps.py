"""Request dependencies as Annotated aliases."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from protocol.storage import ObjectStore
from server.config import Settings
from server.db import transaction
from server.errors import Unauthorized
from server.models import Token
from server.tokens import service as tokens

_bearer = HTTPBearer(auto_error=False)


def get_session(request: Request) -> Iterator[Session]:
    with transaction(request.app.state.sessionmaker) as session:
        yield session


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_store(request: Request) -> ObjectStore:
    store: ObjectStore = request.app.state.store
    return store


SessionDep = Annotated[Session, Depends(get_session, scope="function")]
SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[ObjectStore, Depends(get_store)]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def _principal(session: Session, credentials: Credentials, *kinds: str) -> Token:
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise Unauthorized("missing bearer token")
    return tokens.authenticate(session, credentials.credentials, kinds)


def require_admin(session: SessionDep, credentials: Credentials) -> Token:
    return _principal(session, credentials, "admin")


def require_worker(session: SessionDep, credentials: Credentials) -> Token:
    return _principal(session, credentials, "worker")


def require_learner(session: SessionDep, credentials: Credentials) -> Token:
    return _principal(session, credentials, "learner")


def require_registration(session: SessionDep, credentials: Credentials) -> Token:
    return _principal(session, credentials, "registration")


AdminDep = Annotated[Token, Depends(require_admin)]
WorkerDep = Annotated[Token, Depends(require_worker)]
LearnerDep = Annotated[Token, Depends(require_learner)]
RegistrationDep = Annotated[Token, Depends(require_registration)]
