"""The request dependencies that know no feature: the request's session, settings and store,
its bearer credentials, releasing a read-only transaction early, and the refusal of text
Postgres cannot store. Who is calling: server/tokens/auth.py (admin, learner, registration) and
server/workers/auth.py (workers); server/deps.py gathers all of them for the routers."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from protocol.error_codes import ErrorCode
from protocol.storage import ObjectStore
from server.config import Settings
from server.db import transaction
from server.errors import Unprocessable

T = TypeVar("T")


def _bearer_scheme(kind: str) -> HTTPBearer:
    """The bearer credentials of one token kind. Each kind is its own OpenAPI security scheme
    (`AdminToken`, ...), so the document says which token an operation takes; the token is
    checked by the guard (server/tokens/auth.py) or the worker call (server/workers/auth.py)."""
    return HTTPBearer(
        scheme_name="".join(part.capitalize() for part in kind.split("_")) + "Token",
        description=f"a {kind} token, sent as `Authorization: Bearer <token>`",
        auto_error=False,
    )


BEARER_SCHEMES = {
    kind: _bearer_scheme(kind)
    for kind in ("admin", "project", "registration", "worker", "learner", "pool_learner")
}


# These three are `async` only so that FastAPI calls them on the event loop instead of taking
# a thread-pool hop each (a sync generator dependency takes two): they do no I/O there. The
# session's transaction is ended inside the endpoint's own thread (server/routing.py), so the
# commit on leaving `transaction` has nothing left to send.
async def get_session(request: Request) -> AsyncIterator[Session]:
    with transaction(request.app.state.sessionmaker) as session:
        yield session


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_store(request: Request) -> ObjectStore:
    store: ObjectStore = request.app.state.store
    return store


SessionDep = Annotated[Session, Depends(get_session, scope="function")]
SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[ObjectStore, Depends(get_store)]
Credentials = HTTPAuthorizationCredentials | None
AdminCredentials = Annotated[Credentials, Depends(BEARER_SCHEMES["admin"])]
ProjectCredentials = Annotated[Credentials, Depends(BEARER_SCHEMES["project"])]
RegistrationCredentials = Annotated[Credentials, Depends(BEARER_SCHEMES["registration"])]
WorkerCredentials = Annotated[Credentials, Depends(BEARER_SCHEMES["worker"])]
LearnerCredentials = Annotated[Credentials, Depends(BEARER_SCHEMES["learner"])]
PoolLearnerCredentials = Annotated[Credentials, Depends(BEARER_SCHEMES["pool_learner"])]


def released(session: Session, principal: T) -> T:
    """End the (read-only) authentication transaction before the dependency returns, so its
    connection goes back to the pool. Sync dependencies and the endpoint run in separate
    thread-pool hops: a request holding a connection while it waits for a thread, with every
    thread waiting for a connection, would deadlock until the pool timeout."""
    session.commit()
    return principal


# JSON escapes of U+0000 and of UTF-16 surrogates (which may be unpaired).
_SUSPECT_ESCAPE = re.compile(rb"\\u(0000|[dD][89a-fA-F])")


async def refuse_unstorable_text(request: Request) -> None:
    """Postgres text and jsonb cannot hold U+0000, and an unpaired surrogate cannot be encoded
    to UTF-8, so a JSON body carrying either would end in a 500 at the first query: refuse it up
    front with 422 and the field. (Raw NUL bytes are not valid JSON: body validation refuses
    those.)"""
    if "json" not in request.headers.get("content-type", ""):
        return
    body = await request.body()
    if not _SUSPECT_ESCAPE.search(body):
        return
    try:
        data = json.loads(body)
    except ValueError:
        return  # malformed JSON: the body validation answers 422
    field = _unstorable_field(data, ())
    if field is not None:
        message = "text may not contain NUL (\\u0000) or unpaired surrogates"
        raise Unprocessable(
            "invalid request",
            errors=[{"field": field, "message": message, "type": "text"}],
            code=ErrorCode.validation_failed,
        )


def _unstorable(text: str) -> bool:
    if "\x00" in text:
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _unstorable_field(value: Any, path: tuple[str, ...]) -> str | None:
    """Dotted path of the first string (or key) Postgres could not store, or None."""
    if isinstance(value, str):
        return ".".join(path) if _unstorable(value) else None
    items: list[tuple[str, Any]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if _unstorable(key):
                return ".".join((*path, ascii(key)))
            items.append((key, item))
    elif isinstance(value, list):
        items = [(str(i), item) for i, item in enumerate(value)]
    for key, item in items:
        found = _unstorable_field(item, (*path, key))
        if found is not None:
            return found
    return None
