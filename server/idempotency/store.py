"""The stored answers of keyed calls (server/models/idempotency.py), all inside the caller's
transaction: `claim` first (a repeat's stored answer, or the key taken for this call), `keep`
last (the answer, or the key let go when the call applied nothing), `purge` for the retention
job."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

from fastapi.responses import Response
from pydantic import BaseModel
from sqlalchemy import delete, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from protocol.error_codes import ErrorCode
from protocol.idempotency import IDEMPOTENCY_HEADER
from server.db import db_time, is_postgres
from server.errors import Unprocessable
from server.idempotency.keys import KeyedCall
from server.models import IdempotencyWatermark, IdempotentAnswer

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Answer:
    """An answer as sent: status, JSON body (empty for a 204) and the headers it carries."""

    status_code: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, model: BaseModel, headers: dict[str, str] | None = None) -> Answer:
        dumped = model.model_dump(mode="json", by_alias=True)  # as FastAPI sends a response_model
        body = json.dumps(dumped, separators=(",", ":")).encode()
        return cls(200, body, dict(headers or {}))

    def response(self) -> Response:
        media = "application/json" if self.body else None
        return Response(self.body, self.status_code, headers=self.headers, media_type=media)


def _insert(session: Session) -> Any:
    return (postgresql if is_postgres(session) else sqlite).insert(IdempotentAnswer)


def claim(session: Session, call: KeyedCall) -> Answer | None:
    """The answer stored under the key (its repeat), or None with the key taken for this call in
    this transaction. A concurrent call holding the key makes this one wait for its end (the
    primary key's unique index and row lock on Postgres, the write lock on SQLite), then see its
    answer. 422 when the key was first used for another request, or is older than what was let
    go of."""
    taken = session.execute(
        _insert(session)
        .values(
            scope=call.scope, key=call.key, key_time=call.key_time, fingerprint=call.fingerprint
        )
        .on_conflict_do_nothing(index_elements=["scope", "key"])
        .returning(IdempotentAnswer.key)
    ).first()
    if taken is not None:
        _refuse_forgotten(session, call)
        return None
    if _take_unanswered(session, call):
        return None
    stored = session.execute(
        select(
            IdempotentAnswer.fingerprint,
            IdempotentAnswer.status_code,
            IdempotentAnswer.body,
            IdempotentAnswer.headers,
        ).where(*_this(call))
    ).one()
    if stored.fingerprint != call.fingerprint or stored.status_code is None:
        raise Unprocessable(
            f"this {IDEMPOTENCY_HEADER} was used for another request: make a new key per call",
            field=IDEMPOTENCY_HEADER,
            code=ErrorCode.idempotency_key_reused,
        )
    return Answer(stored.status_code, bytes(stored.body or b""), dict(stored.headers or {}))


def _take_unanswered(session: Session, call: KeyedCall) -> bool:
    """Take a key committed without an answer (a refusal that committed part of its work before
    refusing, as attach's failed run): nothing was answered under it, so its call runs again. The
    update locks the row on Postgres: a concurrent taker waits, then finds the answer."""
    taken = session.execute(
        update(IdempotentAnswer)
        .where(
            *_this(call),
            IdempotentAnswer.status_code.is_(None),
            IdempotentAnswer.fingerprint == call.fingerprint,
        )
        .values(fingerprint=call.fingerprint)
        .returning(IdempotentAnswer.key)
    ).first()
    return taken is not None


def _this(call: KeyedCall) -> tuple[Any, ...]:
    return (IdempotentAnswer.scope == call.scope, IdempotentAnswer.key == call.key)


def _changed(result: Any) -> int:
    return int(result.rowcount)


def _refuse_forgotten(session: Session, call: KeyedCall) -> None:
    """A key made at or before the latest one retention let go of may have been applied and
    forgotten: refused (the taken key rolls back with the refusal)."""
    forgotten = session.execute(
        select(IdempotencyWatermark.key_time).where(IdempotencyWatermark.scope == call.scope)
    ).scalar_one_or_none()
    if forgotten is not None and call.key_time <= forgotten:
        raise Unprocessable(
            f"this {IDEMPOTENCY_HEADER} is older than the answers this server keeps: its call "
            "may have been applied, and is not applied again; make a new key",
            field=IDEMPOTENCY_HEADER,
            code=ErrorCode.idempotency_key_expired,
        )


def keep(session: Session, call: KeyedCall, answer: Answer | None) -> None:
    """Store the call's answer under its key, in the transaction of its change; None (the call
    applied nothing: a 204, an empty claim) lets the key go, so its retry simply runs."""
    where = _this(call)
    if answer is None:
        session.execute(delete(IdempotentAnswer).where(*where))
        return
    session.execute(
        update(IdempotentAnswer)
        .where(*where)
        .values(status_code=answer.status_code, body=answer.body, headers=answer.headers)
    )


def purge(session: Session, retention_s: float) -> int:
    """Delete the answers older than the retention, first raising each caller's watermark to the
    latest key time among them (one cutoff for both: nothing is deleted unrecorded)."""
    cutoff = db_time(session) - timedelta(seconds=retention_s)
    old = IdempotentAnswer.created_at < cutoff
    latest = session.execute(
        select(IdempotentAnswer.scope, func.max(IdempotentAnswer.key_time))
        .where(old)
        .group_by(IdempotentAnswer.scope)
    ).all()
    for scope, key_time in latest:
        mark = session.get(IdempotencyWatermark, scope)
        if mark is None:
            session.add(IdempotencyWatermark(scope=scope, key_time=key_time))
        elif key_time > mark.key_time:
            mark.key_time = key_time
    session.flush()
    return _changed(session.execute(delete(IdempotentAnswer).where(old)))


def in_session(
    session: Session,
    call: KeyedCall | None,
    work: Callable[[], M],
    kept: Callable[[M], bool] = lambda _result: True,
) -> M | Answer:
    """A call on the request's session under its key (None: as it always was): the stored
    answer of a repeat, else `work()`'s answer stored beside its change, in the session's one
    transaction (committed by the route). `kept` false: it applied nothing (an empty claim), the
    key is let go and its retry simply runs."""
    if call is None:
        return work()
    stored = claim(session, call)
    if stored is not None:
        return stored
    result = work()
    answer = Answer.of(result) if kept(result) else None
    keep(session, call, answer)
    return result if answer is None else answer


def sent(answer: M | Answer) -> M | Response:
    """What the route returns: the model as FastAPI sends it, or a stored answer as stored."""
    return answer.response() if isinstance(answer, Answer) else answer
